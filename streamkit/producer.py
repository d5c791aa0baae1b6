"""The streamkit producer: layout-aware placement, epoch stamps, the change protocol.

``Producer`` is usable alone, outside an app::

    async with Producer("127.0.0.1:9092", client_id="orders-api") as p:
        await p.send("orders", key="customer-7", value={"total": 12})
        await p.flush()

- **Placement.**  Keyed records of a topic with a layout go to
  ``lh_bucket(key_hash(key), n0, active)`` (``streamkit.layout.placement``): never a
  ReadOnly or None partition.  Topics without a layout use Kafka's default
  partitioner over the physical count.  Records without a key go round robin.
- **Stamps.**  Every record is stamped with this producer's tag (the six hex digits
  that end its id) and the layout epoch it was placed with (ASCII digits; 0 for a topic
  without a layout), so consumers can detect late records: one header, ``sk``, on the
  first record of each batch and on every record with headers of its own; the other
  records of a batch carry it through their batch (``streamkit.layout.stamps``).
- **The change protocol** (``streamkit.layout.protocol``): the producer polls the
  layout registry every ``refresh_ms``, heartbeats every ``heartbeat_ms`` and holds a
  lease of ``lease_ms``; on an announced change it switches placement, re-places the
  records it has not yet handed to the network, waits for the broker to acknowledge
  everything placed under the older epoch, then acknowledges (``streamkit.producer_acks``).
  It never places a record with an expired lease: it first heartbeats and re-reads the
  registry.  If a sealed change names it as fenced (it missed the deadline: paused,
  partitioned), it logs a warning, appends a :class:`FenceEvent` to
  :attr:`Producer.fences`, calls ``on_fence`` if it is a callable, writes a ``fenced``
  control record, and with ``on_fence="raise"`` makes every later :meth:`Producer.send`
  raise :class:`ProducerFencedError` until :meth:`Producer.clear_fence`.
- **Batching.**  Records are appended to one open batch per partition (no await per
  record) and handed to the broker when full (``batch_bytes``) or ``linger_ms`` old;
  one batch per partition in flight keeps a partition's order.  :meth:`Producer.send`
  returns a :class:`Delivery`, its :class:`aiokafka.structs.RecordMetadata` when awaited
  (errors also surface in :meth:`Producer.flush` and later sends).
- **Configuration**: :class:`ProducerConfig` (``Producer(bootstrap, client_id, config=)``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.structs import RecordMetadata

from streamkit.connection import Connection, as_connection
from streamkit.delivery import REPLACED, Delivery, OpenBatch, TopicPlacement, encode_key, encode_value
from streamkit.errors import StreamkitError
from streamkit.fencing import FenceEvent, FenceWatch, ProducerFencedError
from streamkit.layout.control import control_record, ensure_acks_topic
from streamkit.layout.model import TopicLayout
from streamkit.layout.registry import LayoutRegistry
from streamkit.layout.seal import OriginSeal
from streamkit.layout.stamps import COPY_HEADER, TAG_BYTES
from streamkit.lease import Lease
from streamkit.producer_acks import ChangeAcks
from streamkit.producer_config import ProducerConfig
from streamkit.producer_placement import PlacementCache

# Delivery, the fence types and the configuration re-exported
__all__ = ["Delivery", "FenceEvent", "Producer", "ProducerConfig", "ProducerFencedError"]

log = logging.getLogger("streamkit.producer")

Headers = Sequence[tuple[str, bytes]] | None
_UNSTAMPED: list[tuple[str, bytes]] = []
"""The headers of a record that its batch stamps (a list: aiokafka's builder takes no other; never mutated)."""


class Producer:
    """An asyncio producer that follows topic layouts (see the module docstring)."""

    def __init__(
        self,
        bootstrap: str | Connection,
        client_id: str = "streamkit-producer",
        *,
        config: ProducerConfig | None = None,
    ) -> None:
        cfg = self.config = config if config is not None else ProducerConfig()
        self.connection = as_connection(bootstrap)
        self.bootstrap = self.connection.bootstrap
        self.client_id = client_id
        self._tag = uuid.uuid4().hex[:TAG_BYTES].encode()
        self.producer_id = f"{client_id}-{self._tag.decode()}"
        self.linger = cfg.linger_ms / 1000
        self.batch_bytes = cfg.batch_bytes
        self._key = cfg.key_serializer or encode_key
        self._value = cfg.value_serializer or encode_value
        self.acks_topic = cfg.acks_topic
        self.follow_layouts = cfg.follow_layouts
        self._kp = AIOKafkaProducer(
            **self.connection.client_kwargs(),
            client_id=client_id,
            acks=cfg.acks,
            linger_ms=0,
            max_batch_size=cfg.batch_bytes,
            max_request_size=max(cfg.batch_bytes * 2, 1 << 20),
            compression_type=cfg.compression_type,
            request_timeout_ms=cfg.request_timeout_ms,
            enable_idempotence=False,
        )
        self.registry = LayoutRegistry(self.connection, client_id=self.producer_id, topic=cfg.layouts_topic)
        self._lease = Lease(
            self.producer_id,
            client_id,
            self.registry,
            self._send_control,
            lease_ms=cfg.lease_ms,
            heartbeat_ms=cfg.heartbeat_ms,
            refresh_ms=cfg.refresh_ms,
        )
        self._placements = PlacementCache(
            self.producer_id,
            self._tag,
            self.registry,
            lambda topic: self._kp.partitions_for(topic),  # the client now (a test may replace it)
            follow_layouts=cfg.follow_layouts,
        )
        self._topics = self._placements.topics  # the cache's own dict: one lookup per send
        self._open: dict[tuple[str, int], OpenBatch] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._inflight: dict[str, set[asyncio.Future[None]]] = {}
        self._dispatches: set[asyncio.Task[None]] = set()
        """Batches being handed to the client, each in a task of its own (a cancelled sender does not stop it)."""
        self._tasks: list[asyncio.Task[Any]] = []
        self._error: BaseException | None = None
        self._started = False
        self._seal = OriginSeal.ephemeral()  # (the cluster's once started, following layouts)
        self._closed = False
        self._fences = FenceWatch(self.producer_id, cfg.on_fence, self._send_control)
        self._stats: dict[str, int] = dict.fromkeys(("records", "batches", "switches", "replaced", "acks", "copies"), 0)
        self._changes = ChangeAcks(self.producer_id, self._send_control, self._inflight, self._stats, cfg.before_ack)

    @property
    def stats(self) -> dict[str, int]:
        """Counters: records, batches, switches (layout changes followed), replaced
        (records placed again after one), acks, copies (for compaction), lease_renewals."""
        return {**self._stats, "lease_renewals": self._lease.renewals}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> Producer:
        if self._started:
            return self
        await self._kp.start()
        if self.follow_layouts:
            await self.registry.start()
            self._seal = await self.registry.load_origin_seal()  # copies for compaction are sealed
            await ensure_acks_topic(self.registry.io, self.acks_topic)
            self.registry.add_listener(self._on_layout)
            await self._lease.renew()
            self._tasks.append(asyncio.create_task(self._lease.keep(), name=f"{self.producer_id}-lease"))
        self._tasks.append(asyncio.create_task(self._linger_loop(), name=f"{self.producer_id}-linger"))
        self._started = True
        return self

    async def stop(self) -> None:
        if self._closed or not self._started:
            self._closed = True
            return
        try:
            await self.flush()
        finally:
            self._closed = True
            for t in self._tasks:
                t.cancel()
            if ending := [*self._tasks, *self._changes.tasks]:  # their ends, not their errors (flush raised those)
                await asyncio.wait(ending)  # a cancel of stop() itself goes through
                for t in ending:
                    if not t.cancelled():
                        t.exception()  # retrieved: no "never retrieved" warning at exit
            if self.follow_layouts:
                try:
                    key, value = control_record("bye", self.producer_id)
                    async with asyncio.timeout(5):
                        await self._kp.send_and_wait(self.acks_topic, value, key=key, partition=0)
                except Exception:  # noqa: BLE001 - best effort
                    pass
                await self.registry.stop()
            await self._kp.stop()

    async def __aenter__(self) -> Producer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ public API

    def layout(self, topic: str) -> TopicLayout | None:
        """The layout this producer currently places ``topic``'s records with."""
        return self._placements.layout(topic)

    def epoch(self, topic: str) -> int:
        return self._placements.epoch(topic)

    async def partition_for(self, topic: str, key: Any) -> int:
        st = self._topics.get(topic) or await self._placements.of(topic)
        return st.place(self._key(key))

    def clear_fence(self) -> None:
        """Let sends proceed again after a fence (``on_fence="raise"``)."""
        self._fences.pending = None

    @property
    def fences(self) -> list[FenceEvent]:
        """Every layout change this producer was fenced by (it did not acknowledge in time)."""
        return self._fences.events

    async def send(
        self,
        topic: str,
        key: Any,
        value: Any,
        headers: Headers = None,
        *,
        timestamp_ms: int | None = None,
    ) -> Delivery:
        """Place and queue one record; returns an awaitable of its RecordMetadata."""
        if self._closed or not self._started:
            raise StreamkitError("the producer is not running (use `async with Producer(...)` or start())")
        if self._error is not None:
            raise self._error
        self._fences.raise_if_fenced()
        if self.follow_layouts and self._lease.expired:
            await self._lease.renew()
        st = self._topics.get(topic)
        if st is None:
            st = await self._placements.of(topic)
        kb = key if type(key) is bytes else self._key(key)
        vb = value if type(value) is bytes else self._value(value)
        d, full = self._append(st, kb, vb, headers, timestamp_ms, None)
        if full is not None:  # other senders' records too: a cancelled send must not drop them
            await asyncio.shield(self._dispatch_tracked(full))
        if st.parents is not None and kb is not None:
            await self._copy(st, kb, vb, timestamp_ms)
        return d

    async def send_and_wait(
        self, topic: str, key: Any, value: Any, headers: Headers = None, **kw: Any
    ) -> RecordMetadata:
        d = await self.send(topic, key, value, headers, **kw)
        self._seal_topic(topic)
        return await d

    async def send_many(self, topic: str, items: Iterable[tuple[Any, Any]], headers: Headers = None) -> int:
        """Queue ``(key, value)`` pairs; returns how many (errors surface in :meth:`flush`)."""
        n = 0
        for key, value in items:
            await self.send(topic, key, value, headers)
            n += 1
        return n

    async def flush(self) -> None:
        """Hand every open batch to the broker and wait until all are acknowledged."""
        while True:  # until nothing is open or in flight (a batch may be sealed meanwhile)
            for k in list(self._open):
                ob = self._open.pop(k, None)
                if ob is not None:  # behind the batches of its partition already handed to tasks: in order
                    await asyncio.shield(self._dispatch_tracked(ob))
            pending = [f for s in self._inflight.values() for f in s if not f.done()]
            if not pending and not self._open:
                break
            await asyncio.gather(*pending, return_exceptions=True)
        if self._error is not None:
            raise self._error

    async def mark(self, topic: str, header: tuple[str, bytes]) -> None:
        """Write a record with no key, an empty value and ``header`` into every partition
        of ``topic`` and wait until the broker has them all (exactly-once markers: after
        :meth:`flush`, so each lands behind the output sent before it)."""
        if self._closed or not self._started:
            raise StreamkitError("the producer is not running (use `async with Producer(...)` or start())")
        partitions = sorted(await self._kp.partitions_for(topic) or ())
        if not partitions:
            raise StreamkitError(f"topic {topic!r} has no partitions the client knows of")
        sent = [await self._kp.send(topic, b"", key=None, partition=q, headers=[header]) for q in partitions]
        await asyncio.gather(*sent)

    # ------------------------------------------------------------------ batching

    async def _copy(self, st: TopicPlacement, kb: bytes, vb: bytes | None, ts: int | None) -> None:
        """KIP-253's rule for compacted topics: a keyed record also goes to the partitions
        its key's partition was split from, marked as a copy (consumers skip it), so that
        compaction there drops the key's values from before the splits. Best effort, like
        the proposal's acks=0: a copy that fails is logged, never the send's error."""
        assert st.parents is not None
        headers = [(COPY_HEADER, self._seal.seal_copy(st.topic, st.place(kb), kb, vb)), st.headers[0]]
        pending = self._inflight.setdefault(st.topic, set())
        for q in st.parents(kb):
            fut = await self._kp.send(st.topic, vb, key=kb, partition=q, headers=headers, timestamp_ms=ts)
            pending.add(fut)
            fut.add_done_callback(self._copied)
            self._stats["copies"] += 1

    def _copied(self, fut: asyncio.Future[Any]) -> None:
        for pending in self._inflight.values():
            pending.discard(fut)
        if not fut.cancelled() and (exc := fut.exception()) is not None:
            log.warning("%s: a copy for compaction was not written: %s", self.producer_id, exc)

    def _append(
        self,
        st: TopicPlacement,
        kb: bytes | None,
        vb: bytes | None,
        headers: Headers,
        ts: int | None,
        d: Delivery | None,
    ) -> tuple[Delivery, OpenBatch | None]:
        """Append to the partition's open batch; return the delivery and a batch that
        became full (to dispatch)."""
        p = st.place(kb)
        k = (st.topic, p)
        ob = self._open.get(k)
        if ob is None:
            ob = self._open[k] = OpenBatch(st.topic, p, self._kp.create_batch(), st.epoch)
        # The stamp goes on a batch's first record and on records with headers of their
        # own; the others carry it through their batch (streamkit.layout.stamps).
        hdrs = st.headers + list(headers) if headers else (_UNSTAMPED if ob.records else st.headers)
        meta = ob.builder.append(timestamp=ts, key=kb, value=vb, headers=hdrs)
        full = None
        if meta is None:
            full = ob
            ob = self._open[k] = OpenBatch(st.topic, p, self._kp.create_batch(), st.epoch)
            meta = ob.builder.append(timestamp=ts, key=kb, value=vb, headers=hdrs or st.headers)
            if meta is None:
                del self._open[k]
                raise ValueError(
                    f"record of {len(vb or b'') + len(kb or b'')} bytes is too large for a batch of {self.batch_bytes}"
                )
        if d is None:
            d = Delivery(ob, meta.offset, ts)
        else:
            d._ob, d._rel = ob, meta.offset
        # Kept to be placed again after a layout change: a copy of its own size (orjson's output pins 4 KiB).
        ob.records.append((kb, vb if vb is None else memoryview(vb).tobytes(), headers, ts, d))
        self._stats["records"] += 1
        return d, full

    def _seal_topic(self, topic: str | None = None) -> None:
        """Dispatch open batches (of one topic) now, in the background."""
        for k in [k for k in self._open if topic is None or k[0] == topic]:
            self._dispatch_later(self._open.pop(k))

    def _dispatch_later(self, ob: OpenBatch) -> None:
        """:meth:`_dispatch` in the background, the batch counted in flight at once: a
        :meth:`flush` right after (before the task first runs) waits for it too."""
        self._dispatch_tracked(ob)

    def _dispatch_tracked(self, ob: OpenBatch) -> asyncio.Task[None]:
        """:meth:`_dispatch` as a task of its own, kept until it ends, the batch counted in
        flight at once; its error reaches :meth:`flush` and the next :meth:`send` through
        ``_error`` whoever awaited it."""
        self._inflight.setdefault(ob.topic, set()).add(ob.future)
        task = asyncio.ensure_future(self._dispatch(ob))
        self._dispatches.add(task)
        task.add_done_callback(self._dispatched)
        return task

    def _dispatched(self, task: asyncio.Task[None]) -> None:
        self._dispatches.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: it is in _error (and the batch's future) already

    async def _dispatch(self, ob: OpenBatch) -> None:
        """Hand a closed batch to the broker; per partition in FIFO order."""
        k = (ob.topic, ob.partition)
        if ob.epoch < self._changes.acked_epoch.get(ob.topic, -1):  # would land after the seal: late records
            log.error(
                "%s: batch of %s[%d] stamped %d dispatched after acking a newer epoch",
                self.producer_id,
                ob.topic,
                ob.partition,
                ob.epoch,
                stack_info=True,
            )
        self._inflight.setdefault(ob.topic, set()).add(ob.future)
        lock = self._locks.get(k)
        if lock is None:
            lock = self._locks[k] = asyncio.Lock()
        try:
            async with lock:
                delivery = await self._kp.send_batch(ob.builder, ob.topic, partition=ob.partition)
            self._stats["batches"] += 1
        except BaseException as exc:
            self._fail(ob, exc)
            raise
        delivery.add_done_callback(lambda f, ob=ob: self._delivered(ob, f))

    def _delivered(self, ob: OpenBatch, f: asyncio.Future[Any]) -> None:
        if f.cancelled():
            self._fail(ob, asyncio.CancelledError())
        elif (exc := f.exception()) is not None:
            self._fail(ob, exc)
        else:
            md = f.result()
            self._changes.delivered(ob.topic, ob.partition, md.offset + len(ob.records))
            if not ob.future.done():
                ob.future.set_result(md)
            self._inflight.get(ob.topic, set()).discard(ob.future)

    def _fail(self, ob: OpenBatch, exc: BaseException) -> None:
        if isinstance(exc, asyncio.CancelledError) and ob.records:  # never sent: a later flush must not pass
            exc = StreamkitError(
                f"{self.producer_id}: a batch of {len(ob.records)} record(s) to {ob.topic}[{ob.partition}] was "
                "abandoned unsent (its send was cancelled)"
            )
        if self._error is None:
            self._error = exc
        if not ob.future.done():
            ob.future.set_exception(exc)
            ob.future.exception()  # mark retrieved: errors surface through flush()/send()
        self._inflight.get(ob.topic, set()).discard(ob.future)

    async def _linger_loop(self) -> None:
        tick = max(self.linger / 2, 0.001)
        while True:
            await asyncio.sleep(tick)
            if not self._open:
                continue
            if self.follow_layouts and self._lease.expired:
                try:
                    await self._lease.renew()  # re-places open batches if the layout moved meanwhile
                except Exception as exc:  # noqa: BLE001
                    log.warning("%s: lease renewal failed: %s", self.producer_id, exc)
                    continue
            now = time.monotonic()
            for k in [k for k, ob in self._open.items() if now - ob.created >= self.linger]:
                self._dispatch_later(self._open.pop(k))

    # ------------------------------------------------------------------ layouts, lease, acks

    async def _send_control(self, key: bytes, value: bytes) -> None:
        await self._kp.send_and_wait(self.acks_topic, value, key=key, partition=0)

    async def _on_layout(self, new: TopicLayout, old: TopicLayout | None) -> None:
        """Registry listener: switch placement, re-place unsent records, acknowledge."""
        st = self._topics.get(new.topic)
        if st is not None and (st.layout is None or new.epoch > st.layout.epoch):
            self._switch(new)
        self._fences.check(new)
        self._changes.announce(new)

    def _switch(self, layout: TopicLayout) -> None:
        topic = layout.topic
        st, old = self._placements.switch(layout)
        self._stats["switches"] += 1
        # Records not yet handed to the network are placed again with the new layout.
        stale = [self._open.pop(k) for k in [k for k in self._open if k[0] == topic]]
        for ob in stale:
            for kb, vb, headers, ts, d in ob.records:
                _d, full = self._append(st, kb, vb, headers, ts, d)
                self._stats["records"] -= 1
                self._stats["replaced"] += 1
                if full is not None:
                    self._dispatch_later(full)
            ob.future.set_result(REPLACED)
        log.debug("%s: %s now placed with epoch %d (was %s)", self.producer_id, topic, layout.epoch, old and old.epoch)
