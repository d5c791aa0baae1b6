"""The layout change protocol: announce -> producers switch and acknowledge -> seal.

KIP-253 has the broker reject produce requests carrying a stale partition count.
streamkit cannot change the broker, so a change is two-phase, coordinated by whoever
runs it (``streamkit topics expand|shrink``, :class:`LayoutCoordinator`):

1. **Announce.**  Read every partition's fetch high watermark (the
   ``announce_offsets``), then publish the announced layout (epoch ``e``, unsealed)
   to ``__streamkit_layouts``.  The log decides races: a second coordinator
   announcing the same epoch is refused (:class:`ConcurrentChangeError`).
2. **Switch and acknowledge.**  Every live streamkit producer sees the announcement
   (it polls the registry every ``refresh_ms``, 100 ms by default), places new
   records with the new layout (records not yet handed to the network are placed
   again), waits until every record placed under an older epoch is acknowledged by
   the broker, then writes an ``ack`` to ``__streamkit_layout_acks``.
3. **Seal.**  Once every live producer acknowledged, or at the deadline, read every
   readable partition's high watermark again; the ``seal_offsets`` are those, raised
   to the acknowledged ``ends`` (so a high watermark read that lags an acknowledged
   produce cannot put the seal below records placed with the old layout).  No record
   placed under an older epoch by an acknowledging producer lies at or beyond them.  Publish
   the sealed layout (same epoch), naming the producers that did not acknowledge
   (``Seal.fenced``).

Control records (heartbeats, acks) and their reader live in ``streamkit.layout.control``.

Live producers and the deadline
-------------------------------
A producer holds a *lease*: it may place records only while
``now < min(start of its last heartbeat write, start of its last registry read to the
high watermark) + lease_ms`` (3 s by default); otherwise it first heartbeats and
re-reads the registry.  The coordinator waits for the producers that heartbeated
within ``2 * lease_ms + 1 s`` before the announcement (others hold no valid lease and
will read the announcement before their next record), until
``max(ack_timeout, lease_ms + 1 s)`` (each producer's own lease) after the start of
the wait.

Fencing and late records (the rule)
-----------------------------------
A producer that does not acknowledge by the deadline is *fenced*: it is named in the
sealed layout, and by then its lease has expired (its last registry read began
before the announcement), so it cannot place another record before reading the new
layout.  When it wakes up (partition, pause, SIGSTOP), it re-reads the registry,
places every record it has not yet handed to the network with the new layout,
acknowledges late, reports ``fenced`` (log warning, ``Producer.fences``, optional
callback, a ``fenced`` control record; with ``on_fence="raise"`` its sends raise
:class:`~streamkit.producer.ProducerFencedError` until cleared).

What fencing cannot stop: records that were already on their way to the broker when
the producer stopped.  They land beyond the seal, stamped with the old epoch.
Offsets are immutable, so they cannot be re-routed; consumers recognise them by
epoch (``streamkit.layout.stamps.classify_record`` -> ``LATE``; ``moved`` tells
whether their key now lives elsewhere) and report them (a counter and a violation
record naming producer, key, partition, offset, record epoch, seal epoch) instead of
silently applying them out of order.  ``streamkit.layout.check.check_topic`` scans a topic for them.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from streamkit.connection import Connection, as_connection
from streamkit.kafkaio import CREATE_PARTITIONS_API, KafkaIO
from streamkit.layout import model, transitions
from streamkit.layout.control import (
    DEFAULT_LEASE_MS,
    LIVE_HORIZON_MS,
    AckLog,
    ensure_acks_topic,
    heartbeat_ts,
    live_window_ms,
)
from streamkit.layout.model import ChangeKind, LayoutError, TopicLayout
from streamkit.layout.registry import (
    ACKS_TOPIC,
    LAYOUTS_TOPIC,
    LayoutRegistry,
)

__all__ = [
    "DEFAULT_ACK_TIMEOUT",
    "ChangeResult",
    "LayoutCoordinator",
    "TopicInfo",
]

log = logging.getLogger("streamkit.layout")

DEFAULT_ACK_TIMEOUT = 5.0


@dataclass(frozen=True)
class ChangeResult:
    layout: TopicLayout
    """The sealed layout."""
    acked: frozenset[str]
    fenced: frozenset[str]
    waited: float
    """Seconds spent waiting for acknowledgements."""
    finished_drains: tuple[int, ...] = ()
    waited_for: frozenset[str] = frozenset()
    """The producers that held a lease at the announcement (heartbeated within
    :func:`live_window_ms`): the change waited for each of them to acknowledge."""


@dataclass(frozen=True)
class TopicInfo:
    layout: TopicLayout | None
    physical: int | None
    """Partitions the broker has (None: the topic does not exist)."""
    high_watermarks: dict[int, int]
    meta: dict[str, Any] = field(default_factory=dict)
    group_positions: dict[str, dict[int, int]] = field(default_factory=dict)


class LayoutCoordinator:
    """Runs layout changes of topics against a cluster (what ``streamkit topics`` does).

    ``async with LayoutCoordinator(bootstrap) as co: await co.expand("orders", 8)``.
    """

    def __init__(
        self,
        bootstrap: str | Connection,
        *,
        client_id: str = "streamkit-topics",
        ack_timeout: float = DEFAULT_ACK_TIMEOUT,
        replication_factor: int = 1,
        layouts_topic: str = LAYOUTS_TOPIC,
        acks_topic: str = ACKS_TOPIC,
        progress: Any = None,
    ) -> None:
        self.connection = as_connection(bootstrap)
        self.bootstrap = self.connection.bootstrap
        self.client_id = f"{client_id}-{uuid.uuid4().hex[:8]}"
        self.ack_timeout = ack_timeout
        self.rf = replication_factor
        self.acks_topic = acks_topic
        self.io = KafkaIO(self.connection, client_id=client_id)
        self.registry = LayoutRegistry(
            self.connection,
            client_id=self.client_id,
            topic=layouts_topic,
            io=self.io,
            replication_factor=replication_factor,
        )
        self._progress = progress or (lambda msg: log.info("%s", msg))

    async def start(self) -> LayoutCoordinator:
        await self.io.start()
        await self.registry.start()
        await ensure_acks_topic(self.io, self.acks_topic, self.rf)
        return self

    async def stop(self) -> None:
        await self.registry.stop()
        await self.io.close()

    async def __aenter__(self) -> LayoutCoordinator:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ create / describe

    async def create(
        self,
        topic: str,
        partitions: int,
        *,
        capacity: int | None = None,
        ordered_delivery: bool = True,
        configs: dict[str, str] | None = None,
    ) -> TopicLayout:
        """Create the physical topic (``capacity`` partitions) if missing and its layout.

        An existing topic without a layout is adopted when ``partitions`` equals its
        partition count (keys already sit where Kafka's partitioner put them), or when
        it holds no records yet.
        """
        await self.registry.refresh()
        if (known := self.registry.get(topic)) is not None:
            raise LayoutError(f"{topic} already has a layout: {known.describe()}")
        capacity = partitions if capacity is None else capacity
        layout = transitions.create(topic, partitions, capacity=capacity, ordered_delivery=ordered_delivery)
        existing = await self.io.partition_count(topic)
        if existing is None:
            cfg = {"retention.ms": "604800000", "retention.bytes": "-1", **(configs or {})}
            await self.io.create_topic(topic, capacity, replication_factor=self.rf, configs=cfg)
        else:
            hws = await self.io.high_watermarks(topic, range(existing))
            if existing < capacity:
                raise LayoutError(f"{topic} exists with {existing} partitions, fewer than --capacity {capacity}")
            if existing != partitions and any(hws.values()):
                raise LayoutError(
                    f"{topic} exists with {existing} partitions and holds records placed over {existing}; "
                    f"adopt it with --partitions {existing}"
                )
            if existing > capacity:
                layout = transitions.create(topic, partitions, capacity=existing, ordered_delivery=ordered_delivery)
        return await self.registry.publish(layout)

    async def describe(self, topic: str, groups: Sequence[str] = ()) -> TopicInfo:
        await self.registry.refresh()
        layout = self.registry.get(topic)
        physical = await self.io.partition_count(topic)
        hws = await self.io.high_watermarks(topic, range(physical)) if physical else {}
        positions: dict[str, dict[int, int]] = {}
        for g in groups:
            positions[g] = await self.io.committed(g, topic, list(range(physical or 0)))
        return TopicInfo(layout, physical, hws, self.registry.meta(topic), positions)

    # ------------------------------------------------------------------ changes

    async def _load_settled(self, topic: str) -> TopicLayout:
        layout = await self.registry.load(topic)
        if layout.pending is not None:
            p = layout.pending
            raise model.PendingChangeError(
                f"{topic}: its {p.kind.value} to epoch {p.epoch} is announced but not sealed "
                f"(its coordinator stopped?); finish it with: streamkit topics resume {topic}"
            )
        return layout

    async def expand(self, topic: str, partitions: int, *, grow: bool = True) -> ChangeResult:
        """Grow the active count to ``partitions`` (see the module docstring)."""
        layout = await self._load_settled(topic)
        if partitions <= layout.active:
            transitions.check_expand(layout, partitions)
        broker_count = await self.io.partition_count(topic)
        if broker_count is None:
            raise LayoutError(f"{topic} has a layout but no topic on the broker (was it deleted?)")
        physical = max(layout.physical, broker_count)
        grow_to = None
        if partitions > physical:
            if not grow:
                raise LayoutError(f"{topic} has {physical} physical partitions, fewer than {partitions}")
            if not await self.io.supports_api(CREATE_PARTITIONS_API):
                raise LayoutError(
                    f"cannot expand {topic} to {partitions}: it has {physical} physical partitions and this broker "
                    f"does not support CreatePartitions; add partitions with the broker's own tools "
                    f"(e.g. kafka-topics --alter --partitions {partitions}) and run this again, or create topics "
                    f"with reserved capacity (streamkit topics create T --partitions N --capacity C)"
                )
            grow_to = partitions
        finished: tuple[int, ...] = ()
        due = self._due_drains(layout)
        if due:
            layout = await self.registry.publish(transitions.finish_drain(layout, due))
            finished = due
            self._progress(f"{topic}: drain deadline passed for partitions {list(due)}: given up")
        transitions.check_expand(layout, partitions, physical=max(physical, grow_to or 0))
        if grow_to is not None:
            self._progress(f"{topic}: adding physical partitions {physical} -> {grow_to} (CreatePartitions)")
            await self.io.create_partitions(topic, grow_to)
            physical = grow_to
        hws = await self.io.high_watermarks(topic, range(physical))
        announced = transitions.expand(layout, partitions, physical=physical, announce_offsets=hws)
        result = await self._run(announced)
        return replace(result, finished_drains=finished)

    async def shrink(self, topic: str, partitions: int, *, delay: float = 300.0) -> ChangeResult:
        """Reduce the active count to ``partitions``; the rest drain (ReadOnly)."""
        layout = await self._load_settled(topic)
        transitions.check_shrink(layout, partitions, delay)
        hws = await self.io.high_watermarks(topic, layout.readable)
        announced = transitions.shrink(layout, partitions, delay, announce_offsets=hws)
        return await self._run(announced)

    async def resume(self, topic: str) -> ChangeResult:
        """Finish an announced change whose coordinator stopped (waits, then seals)."""
        layout = await self.registry.load(topic)
        if layout.pending is None:
            raise LayoutError(f"{topic}: nothing to resume (epoch {layout.epoch} is sealed)")
        return await self._complete(layout)

    async def set_ordered_delivery(self, topic: str, enabled: bool) -> TopicLayout:
        layout = await self._load_settled(topic)
        return await self.registry.publish(transitions.set_ordered_delivery(layout, enabled))

    def _due_drains(self, layout: TopicLayout, now_ms: int | None = None) -> tuple[int, ...]:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return tuple(p for p in layout.draining if (dl := layout.drain_deadline_ms(p)) is not None and dl <= now)

    async def finish_drain(
        self,
        topic: str,
        partitions: Iterable[int] | None = None,
        *,
        groups: Sequence[str] = (),
        force: bool = False,
    ) -> tuple[TopicLayout, tuple[int, ...], dict[int, str]]:
        """Give up draining partitions: those whose deadline passed, those every group in
        ``groups`` consumed to their end (the seal, or the high watermark if late records
        landed beyond it), or (``force``) the ones named.

        Returns the layout, the partitions given up, and why each remaining one was kept.
        """
        layout = await self._load_settled(topic)
        wanted = set(layout.draining if partitions is None else partitions)
        bad = wanted - set(layout.draining)
        if bad:
            raise LayoutError(f"{topic}: partitions {sorted(bad)} are not draining (draining: {list(layout.draining)})")
        due = set(self._due_drains(layout)) & wanted
        kept: dict[int, str] = {}
        done = set(due)
        for d in sorted(wanted - due):
            if force:
                done.add(d)
                continue
            end = self._drain_end(layout, d)
            if not groups:
                dl = layout.drain_deadline_ms(d)
                kept[d] = f"drains until {time.strftime('%H:%M:%S', time.localtime((dl or 0) / 1000))}"
                continue
            # Up to the high watermark, not just the seal: records beyond the seal are late
            # ones, and a group must have read (and reported) them before they are given up.
            if end is not None:
                end = max(end, await self.io.high_watermark(topic, d))
            lagging = []
            for g in groups:
                pos = (await self.io.committed(g, topic, [d])).get(d, 0)
                if end is None or pos < end:
                    lagging.append(f"{g} at {pos}/{end}")
            if lagging:
                kept[d] = "not drained by " + ", ".join(lagging)
            else:
                done.add(d)
        if done:
            layout = await self.registry.publish(transitions.finish_drain(layout, sorted(done), force=True))
        return layout, tuple(sorted(done)), kept

    @staticmethod
    def _drain_end(layout: TopicLayout, d: int) -> int | None:
        for s in reversed(layout.seals):
            if s.kind == ChangeKind.SHRINK and d in s.partitions:
                return s.seal_offset(d)
        return None

    # ------------------------------------------------------------------ the protocol

    async def _run(self, announced: TopicLayout) -> ChangeResult:
        pend = announced.pending
        assert pend is not None
        await self.registry.publish(announced)
        self._progress(
            f"{announced.topic}: announced {pend.kind.value} {pend.old_active} -> {pend.new_active} "
            f"(epoch {pend.epoch}); waiting for producers"
        )
        return await self._complete(announced)

    async def _complete(self, announced: TopicLayout) -> ChangeResult:
        pend = announced.pending
        assert pend is not None
        acks = AckLog(self.io, self.acks_topic)
        started = time.monotonic()
        await acks.seek_time(pend.ts_ms - LIVE_HORIZON_MS)
        await acks.catch_up()
        live = {
            pid: d
            for pid, d in acks.last.items()
            if d.get("type") == "hb"
            and heartbeat_ts(d) >= pend.ts_ms - live_window_ms(int(d.get("lease_ms", DEFAULT_LEASE_MS)))
        }
        # Each producer is waited for until its own deadline: ack_timeout, but at least
        # its lease + 1 s (by then its lease has run out: it cannot place records with
        # the old layout any more without reading the new one).
        deadlines = {
            pid: started + max(self.ack_timeout, int(d.get("lease_ms", DEFAULT_LEASE_MS)) / 1000 + 1.0)
            for pid, d in live.items()
        }
        waiting = set(live)
        while True:
            acked = acks.acked(announced.topic, pend.epoch, pend.change_id)
            now = time.monotonic()
            waiting = {p for p in set(live) - acked}
            if not any(deadlines[p] > now for p in waiting):
                break
            await acks.poll(wait_ms=50)
        acked = acks.acked(announced.topic, pend.epoch, pend.change_id)
        fenced = frozenset(waiting)
        waited = time.monotonic() - started
        if fenced:
            names = ", ".join(
                f"{p} ({live[p].get('client_id')}@{live[p].get('host')}:{live[p].get('pid')})" for p in sorted(fenced)
            )
            self._progress(f"{announced.topic}: no acknowledgement within {waited:.1f} s from {names}: fenced")
        hws = await self.io.high_watermarks(announced.topic, announced.readable)
        for p, end in acks.ends.get((announced.topic, pend.epoch, pend.change_id), {}).items():
            if p in hws and end > hws[p]:
                log.warning(
                    "%s[%d]: high watermark %d is below an acknowledged end %d; sealing at %d",
                    announced.topic,
                    p,
                    hws[p],
                    end,
                    end,
                )
                hws[p] = end
        sealed = transitions.seal(announced, hws, fenced=fenced)
        published = await self.registry.publish(sealed)
        self._progress(f"{announced.topic}: sealed epoch {pend.epoch} ({len(acked)} producer(s) acknowledged)")
        log.info(
            "%s: epoch %d sealed after %.3f s; waited for %s; acknowledged by %s; fenced %s",
            announced.topic,
            pend.epoch,
            waited,
            sorted(live),
            sorted(acked),
            sorted(fenced),
        )
        return ChangeResult(published, frozenset(acked), fenced, waited, waited_for=frozenset(live))
