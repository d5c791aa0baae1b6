"""The layout registry: every topic's layout, kept in an internal topic of the cluster.

Storage
-------
Topic ``__streamkit_layouts`` (one partition; ``cleanup.policy=compact`` where the
broker compacts, infinite retention).  One record per layout version, key = the topic
name (UTF-8), value = JSON ``{"v": 1, "by": <client id>, "ts": <ms>, "layout":
TopicLayout.to_dict()}``.  Whole layouts, not deltas: the newest record of a topic is
enough (compaction keeps exactly that).  How a record is written, read back and
accepted: ``streamkit.layout.registry_records``.

Reading and acceptance (as KIP-232 has clients treat metadata)
---------------------------------
A reader reads the partition to the high watermark of a fetch response (never
ListOffsets) and keeps, per topic, the newest layout by *version* ``(epoch, sealed)``.
A record is accepted only if it is newer than what the reader holds AND continues
its history (the change ids of the held layout are a prefix of the record's).  So:

- metadata older than (or equal to) what the client has already seen is refused
  (``refusals`` lists it; ``stale_refused`` counts it) and never replaces the newer;
- the log is the arbiter of concurrent changes: of two coordinators that both
  announce epoch ``e + 1`` from epoch ``e``, the record first in the log wins and the
  other is refused as stale; :meth:`LayoutRegistry.publish` re-reads after writing
  and raises :class:`ConcurrentChangeError` to the loser.

Layout metadata that reaches a client by another path (an assignment, a checkpoint,
a record's epoch header) goes through :meth:`LayoutRegistry.offer` /
:meth:`LayoutRegistry.ensure_at_least`: older than seen -> refused and the registry
is re-read; newer than seen -> the registry is re-read until it has caught up.

If the log's high watermark falls below the reader's position (the broker lost its
log, e.g. an in-memory broker restarted), the reader starts again from offset 0
keeping what it has seen, so older layouts found there are still refused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any

from aiokafka import AIOKafkaProducer

from streamkit.connection import Connection, as_connection
from streamkit.internal_records import decode_guarded
from streamkit.kafkaio import FetchedRecord, KafkaIO, KafkaIOError
from streamkit.layout.model import LayoutError, TopicLayout
from streamkit.layout.registry_records import (
    MalformedLayoutRecordError,
    Refusal,
    accepts,
    decode_layout_record,
    encode_layout_record,
)
from streamkit.layout.seal import OriginSeal, load_seal

__all__ = [
    "ACKS_TOPIC",
    "LAYOUTS_TOPIC",
    "ConcurrentChangeError",
    "LayoutNotFoundError",
    "LayoutRegistry",
    "MalformedLayoutRecordError",
    "Refusal",
    "StaleLayoutError",
    "accepts",
    "decode_layout_record",
    "encode_layout_record",
]

log = logging.getLogger("streamkit.layout")

LAYOUTS_TOPIC = "__streamkit_layouts"
ACKS_TOPIC = "__streamkit_layout_acks"
LAYOUTS_TOPIC_CONFIGS = {"cleanup.policy": "compact", "retention.ms": "-1", "retention.bytes": "-1"}
ACKS_TOPIC_CONFIGS = {"retention.ms": str(24 * 3600 * 1000), "retention.bytes": "-1"}


class StaleLayoutError(LayoutError):
    """A layout older than one already seen (KIP-232: refused, re-read)."""


class ConcurrentChangeError(LayoutError):
    """Another change of the same topic won the race in the registry log."""


class LayoutNotFoundError(LayoutError):
    """The topic has no layout in the registry."""


Listener = Callable[[TopicLayout, TopicLayout | None], Awaitable[None] | None]


class LayoutRegistry:
    """A client of the layout registry: load, watch (poll), publish, epoch checks.

    ``async with LayoutRegistry(bootstrap) as reg: layout = await reg.load("orders")``.
    """

    def __init__(
        self,
        bootstrap: str | Connection,
        *,
        client_id: str = "streamkit",
        topic: str = LAYOUTS_TOPIC,
        io: KafkaIO | None = None,
        create_topic: bool = True,
        replication_factor: int = 1,
        epoch_wait: float = 10.0,
    ) -> None:
        self.connection = io.connection if io is not None else as_connection(bootstrap)
        self.bootstrap = self.connection.bootstrap
        self.client_id = client_id
        self.topic = topic
        self._own_io = io is None
        self._io = io or KafkaIO(self.connection, client_id=client_id)
        self._create = create_topic
        self._rf = replication_factor
        self._layouts: dict[str, TopicLayout] = {}
        self._meta: dict[str, dict[str, Any]] = {}
        self._offset = 0
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()
        self._listeners: list[Listener] = []
        self._watch_task: asyncio.Task[None] | None = None
        self.refusals: list[Refusal] = []
        self.stale_refused = 0
        self.last_refresh_start: float = float("-inf")
        """``time.monotonic()`` at the start of the last refresh that reached the end."""
        self._topic_ready = False
        self._decisions: dict[int, bool] = {}
        self._seal: OriginSeal | None = None
        self.epoch_wait = epoch_wait
        """How long :meth:`ensure_at_least` waits for an epoch by default."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> LayoutRegistry:
        await self._io.start()
        await self._ensure_topic()
        return self

    async def _ensure_topic(self) -> None:
        if self._topic_ready:
            return
        if await self._io.partition_count(self.topic) is None:
            if not self._create:
                raise KafkaIOError(f"the layout registry topic {self.topic} does not exist")
            await self._io.create_topic(self.topic, 1, replication_factor=self._rf, configs=LAYOUTS_TOPIC_CONFIGS)
        self._topic_ready = True

    async def load_origin_seal(self, *, create: bool | None = None) -> OriginSeal:
        """Load the cluster's seal on what streamkit writes for itself (``layout.seal``),
        written first if there is none and ``create`` (default: this registry may create
        topics)."""
        if self._seal is None:
            may = self._create if create is None else create
            self._seal = await load_seal(self._io, self._producer_, create=may, replication_factor=self._rf)
        return self._seal

    @property
    def origin_seal(self) -> OriginSeal:
        """The seal :meth:`load_origin_seal` loaded."""
        if self._seal is None:
            raise RuntimeError("the origin seal is not loaded: await LayoutRegistry.load_origin_seal() first")
        return self._seal

    async def stop(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            await asyncio.wait([self._watch_task])  # its end, not its error; a cancel of stop() itself goes through
            if not self._watch_task.cancelled():
                self._watch_task.exception()  # retrieved: said by the watch loop itself
            self._watch_task = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        if self._own_io:
            await self._io.close()

    async def __aenter__(self) -> LayoutRegistry:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def io(self) -> KafkaIO:
        return self._io

    # ------------------------------------------------------------------ reading

    def get(self, topic: str) -> TopicLayout | None:
        """The newest layout of ``topic`` seen so far (no I/O)."""
        return self._layouts.get(topic)

    @property
    def layouts(self) -> dict[str, TopicLayout]:
        return dict(self._layouts)

    def meta(self, topic: str) -> dict[str, Any]:
        """The envelope of the held layout's record (``by``, ``ts``, ``offset``)."""
        return dict(self._meta.get(topic, {}))

    def add_listener(self, fn: Listener) -> None:
        """``fn(new, old)`` is called (and awaited if async) for every accepted layout."""
        self._listeners.append(fn)

    async def refresh(self) -> list[TopicLayout]:
        """Read the registry to its high watermark; return the newly accepted layouts."""
        async with self._lock:
            started = time.monotonic()
            await self._ensure_topic()
            recs, end = await self._io.read(self.topic, 0, self._offset)
            if end < self._offset:
                log.warning(
                    "layout registry %s went back from offset %d to %d (broker lost its log?): re-reading",
                    self.topic,
                    self._offset,
                    end,
                )
                self._offset = 0
                recs, end = await self._io.read(self.topic, 0, 0)
            changed = [c for c in (self._apply(r) for r in recs) if c is not None]
            self._offset = max(self._offset, end)
            self.last_refresh_start = started
        for new, old in changed:
            for fn in self._listeners:
                res = fn(new, old)
                if asyncio.iscoroutine(res):
                    await res
        return [new for new, _ in changed]

    def _apply(self, rec: FetchedRecord) -> tuple[TopicLayout, TopicLayout | None] | None:
        topic = rec.key.decode("utf-8", "replace") if rec.key else "?"

        def refuse(why: str) -> None:
            self.refusals.append(Refusal(topic, rec.offset, None, None, f"malformed: {why}"))

        decoded = decode_guarded(rec, partial(decode_layout_record, rec.value), on_skip=refuse)
        if decoded is None:  # skipped: the layouts held (of this record's topic too) stay
            self._decide(rec.offset, False)
            return None
        layout, env = decoded
        cur = self._layouts.get(layout.topic)
        ok, reason = accepts(cur, layout)
        if not ok:
            if reason.startswith("stale") and cur is not None and layout.version < cur.version:
                self.stale_refused += 1
            self.refusals.append(
                Refusal(layout.topic, rec.offset, layout.version, cur.version if cur is not None else None, reason)
            )
            self._decide(rec.offset, False)
            return None
        self._decide(rec.offset, True)
        self._layouts[layout.topic] = layout
        self._meta[layout.topic] = {"by": env.get("by"), "ts": env.get("ts"), "offset": rec.offset}
        return layout, cur

    def _decide(self, offset: int, accepted: bool) -> None:
        self._decisions[offset] = accepted
        if len(self._decisions) > 4096:
            for k in sorted(self._decisions)[:2048]:
                del self._decisions[k]

    async def load(self, topic: str) -> TopicLayout:
        """Refresh, then the layout of ``topic`` (LayoutNotFoundError if it has none)."""
        await self.refresh()
        layout = self._layouts.get(topic)
        if layout is None:
            raise LayoutNotFoundError(
                f"topic {topic} has no streamkit layout (streamkit topics create {topic} --partitions N)"
            )
        return layout

    async def ensure_at_least(self, topic: str, epoch: int, timeout: float | None = None) -> TopicLayout:
        """Re-read until the layout of ``topic`` has at least ``epoch`` (KIP-232:
        a checkpoint, commit or record names a newer epoch than the cached layout), for
        ``timeout`` seconds (None: the registry's ``epoch_wait``)."""
        timeout = self.epoch_wait if timeout is None else timeout
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            layout = self._layouts.get(topic)
            if layout is not None and layout.epoch >= epoch:
                return layout
            await self.refresh()
            layout = self._layouts.get(topic)
            if layout is not None and layout.epoch >= epoch:
                return layout
            if time.monotonic() > deadline:
                have = layout.epoch if layout else None
                raise StaleLayoutError(
                    f"{topic}: epoch {epoch} is required but the registry has {have} after {timeout} s"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    async def offer(self, layout: TopicLayout) -> TopicLayout:
        """Layout metadata from another path: refused (and re-read) if older than seen.

        Returns the registry's newest layout of the topic after the check; raises
        :class:`StaleLayoutError` only if the registry cannot reach a newer offered epoch.
        """
        cur = self._layouts.get(layout.topic)
        if cur is not None and layout.version < cur.version:
            self.stale_refused += 1
            self.refusals.append(Refusal(layout.topic, -1, layout.version, cur.version, "stale: offered"))
            await self.refresh()
            return self._layouts[layout.topic]
        if cur is None or layout.version > cur.version:
            return await self.ensure_at_least(layout.topic, layout.epoch)
        return cur

    def watch(self, interval: float = 0.2) -> asyncio.Task[None]:
        """Poll the registry every ``interval`` seconds in a background task."""
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.create_task(self._watch(interval), name="streamkit-layout-watch")
        return self._watch_task

    async def _watch(self, interval: float) -> None:
        while True:
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep watching through broker hiccups
                log.warning("layout registry refresh failed: %s", exc)
            await asyncio.sleep(interval)

    # ------------------------------------------------------------------ writing

    async def _producer_(self) -> AIOKafkaProducer:
        if self._producer is None:
            p = AIOKafkaProducer(**self.connection.client_kwargs(), client_id=self.client_id, acks="all", linger_ms=0)
            await p.start()
            self._producer = p
        return self._producer

    async def publish(self, layout: TopicLayout) -> TopicLayout:
        """Append ``layout`` and check it was accepted (first in the log wins).

        Raises :class:`ConcurrentChangeError` (another change won) or
        :class:`StaleLayoutError` (the layout is not newer than the registry's).
        """
        await self._ensure_topic()
        await self.refresh()
        cur = self._layouts.get(layout.topic)
        ok, reason = accepts(cur, layout)
        if not ok:
            cls = StaleLayoutError if reason.startswith("stale") else ConcurrentChangeError
            raise cls(f"{layout.topic}: cannot publish epoch {layout.epoch}: {reason}")
        key, value = encode_layout_record(layout, by=self.client_id)
        prod = await self._producer_()
        meta = await prod.send_and_wait(self.topic, value, key=key, partition=0)
        while self._offset <= meta.offset:
            await self.refresh()
        held = self._layouts.get(layout.topic)
        if not self._decisions.get(meta.offset, False) or held is None:
            winner = held.describe() if held else "nothing"
            raise ConcurrentChangeError(f"{layout.topic}: a concurrent change won the registry; it now holds {winner}")
        return held

    # ------------------------------------------------------------------ helpers

    def versions(self) -> dict[str, tuple[int, int]]:
        return {t: lay.version for t, lay in self._layouts.items()}

    def topics(self) -> Iterable[str]:
        return self._layouts.keys()
