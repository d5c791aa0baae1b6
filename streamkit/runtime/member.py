"""A group member: one consumer that hosts zero or more processors.

The hot loop lives here (`_run_records`): decode, bind, call the handler, count. It is
written for throughput: the context object is reused, tables are bound once per
partition batch, positions are updated once per batch, and output is sent in bulk.

Around it, per partition batch, `_admit` applies ordered delivery (seed 000): the gate
limit of the partition (records beyond it wait until the blockers are consumed to their
seals), and the epoch stamps of records (a newer epoch means our layout is stale: stop
and re-read it; an older one beyond a later seal is a late record of a fenced producer:
reported as a dead letter, never applied silently). Both cost nothing when the topic
has no pending change and records carry the current epoch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from stores.serde import JsonSerde, Serde

from assignors.group import MemberInfo, StreamkitAssignor, TopicShape
from assignors.murmur2 import key_hash
from streamkit.app import App, HandlerSpec
from streamkit.context import Context, Outbox
from streamkit.layout._kafka import HOLE_CONFIRM_SECONDS
from streamkit.layout.gating import GateTracker, classify_record, record_epoch, violation_record
from streamkit.layout.model import PartitionMode, TopicLayout
from streamkit.runtime import checkpointing
from streamkit.runtime.output import Output
from streamkit.runtime.processor import ProcessorState

if TYPE_CHECKING:
    from streamkit.runtime.worker import Worker

log = logging.getLogger(__name__)

GATE_POLL_SECONDS = 0.1


def _decoder(serde: Serde) -> Callable[[bytes], Any]:
    """The fastest callable that decodes like `serde.loads` (orjson's C function for JSON)."""
    if type(serde) is JsonSerde:
        return orjson.loads
    return serde.loads


def shape_of(layout: TopicLayout) -> TopicShape:
    draining = tuple(p for p in range(layout.physical) if layout.mode(p) == PartitionMode.READ_ONLY)
    return TopicShape(layout.n0, layout.active, draining, layout.epoch)


@dataclass
class Route:
    """Where records of one assigned partition go, and what may be delivered."""

    proc: ProcessorState
    handlers: list[HandlerSpec]
    key_loads: Callable[[bytes], Any]
    value_loads: Callable[[bytes], Any]
    position_key: tuple[str, int]
    rebuild_until: int  # offsets below this were already handled by the group: emit nothing
    committed: int  # the group's committed offset as last known
    layout: TopicLayout | None = None
    epoch_bytes: bytes | None = None  # the layout epoch as stamped: records carrying it pass
    limit: int | None = None  # gate: deliver offsets below it only
    stale_epoch: int | None = None  # a record named a newer layout epoch than ours
    hole: tuple[int, int, float] | None = None  # (start, next offset, first seen): see _cut_at_hole


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, member: "GroupMember") -> None:
        self.member = member

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.member.release_all()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self.member.take_assignment()


class GroupMember:
    def __init__(self, worker: "Worker", index: int) -> None:
        self.worker = worker
        self.app: App = worker.app
        self.name = f"{worker.client_id}-m{index}"
        self.output: Output = worker.output
        self.processors: dict[int, ProcessorState] = {}
        self.routes: dict[TopicPartition, Route] = {}
        self.layout_epochs: dict[str, int] = {}
        self.assigned_generation = -1
        """The generation whose assignment this member processes: what its checkpoints are
        stamped with (the coordinator's own value is reset to -1 when it loses the group)."""
        self.trackers: dict[str, GateTracker] = {}
        self.outbox = Outbox()
        self.ctx = Context(self.outbox)
        self.handled = 0
        self.consecutive_failures = 0
        self.zombie_rejections = 0
        self.holes_refetched = 0  # offset holes in fetch answers asked for again (see _cut_at_hole)
        self.awaiting_records = False
        """In ``getmany``, outside any batch: cancelling the loop here loses nothing.  During
        a rebalance ``getmany`` waits for the new assignment, however long that takes."""
        self.gate_closed_at: dict[TopicPartition, float] = {}
        self.gate_waits: list[tuple[str, int, float]] = []  # (topic, partition, seconds gated)
        self._last_alarm = 0.0
        self._since_checkpoint = 0
        self._next_checkpoint = 0.0
        self._next_gate_poll = 0.0
        self._gated = False
        self._regate_needed = False
        self._stopping = False
        s = self.app.settings
        self.assignor = StreamkitAssignor(MemberInfo(p0=worker.p0, p=worker.p0, layouts=self._shapes()))
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=worker.bootstrap,
            group_id=self.app.group_id,
            client_id=self.name,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            partition_assignment_strategy=(self.assignor,),
            session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            max_poll_interval_ms=s.max_poll_interval_ms,
            fetch_max_bytes=s.fetch_max_bytes,
            max_partition_fetch_bytes=s.max_partition_fetch_bytes,
        )

    @property
    def generation(self) -> int:
        coordinator = self.consumer._coordinator
        return coordinator.generation if coordinator is not None else -1

    def _layout(self, topic: str) -> TopicLayout | None:
        return self.worker.registry.get(topic)

    def _shapes(self) -> dict[str, TopicShape]:
        return {
            t: shape_of(layout)
            for t in self.app.input_topics
            if (layout := self.worker.registry.get(t)) is not None
        }

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.subscribe(self.app.input_topics, listener=_Listener(self))

    def on_layout_change(self, new: TopicLayout, old: TopicLayout | None) -> None:
        """A layout of an input topic changed: re-gate; rejoin if placement changed."""
        if new.topic not in self.app.handlers:
            return
        shape = shape_of(new)
        self.assignor.info.layouts[new.topic] = shape
        self._regate_needed = True
        if old is None or (shape_of(old).active, shape_of(old).draining) != (shape.active, shape.draining):
            log.info("%s: layout of %s is now epoch %d (active %d, draining %s): rebalancing",
                     self.name, new.topic, new.epoch, shape.active, list(shape.draining))
            self.consumer._coordinator.request_rejoin()

    # -- rebalances -----------------------------------------------------------------------
    async def release_all(self) -> None:
        """Partitions are being taken away: flush callbacks, checkpoint, commit, close stores."""
        async with self.worker.lock:
            if not self.processors:
                return
            log.info("%s: giving up processors %s (generation %d)", self.name, sorted(self.processors),
                     self.generation)
            await self._fire(self.app.keys_revoked_callbacks)
            await self._checkpoint()
            self._close_all()

    def _close_all(self, discard: bool = False) -> None:
        for proc in self.processors.values():
            if discard:
                for cache in proc.caches.values():
                    cache.discard()
            proc.close()
        self.processors.clear()
        self.routes.clear()
        self.assigned_generation = -1
        for tracker in self.trackers.values():
            tracker.reset()

    async def take_assignment(self) -> None:
        """Fence the partitions, open our processors' stores, seek to their checkpoints."""
        async with self.worker.lock:
            assignment = self.assignor.assignment
            if assignment is None or self._stopping:
                return
            log.info("%s: assigned processors %s (generation %d)", self.name, sorted(assignment.processors),
                     self.generation)
            progress = self.worker.progress
            generation = self.assigned_generation = self.generation
            slots_all = [(t, p) for slots in assignment.processors.values() for t, p, _ in slots]
            # from now on, commits of these partitions from older generations are refused
            await progress.record(self.name, generation, assignment.epochs, {tp: None for tp in slots_all})
            await progress.refresh()
            for topic, epoch in assignment.epochs.items():
                await self.worker.registry.ensure_at_least(topic, epoch)
            self.layout_epochs = {t: lay.epoch for t in self.app.input_topics if (lay := self._layout(t))}
            state_dir = self.app.settings.state_dir
            starts: dict[tuple[str, int], int | None] = {}
            for pid, slots in sorted(assignment.processors.items()):
                proc = await ProcessorState.open(
                    self.app, pid, state_dir, self.app.settings.store_open_timeout
                )
                self.processors[pid] = proc
                for topic, epoch in proc.loaded.layout_epochs.items():
                    if topic in self.app.handlers:  # the store saw a newer layout than we know
                        await self.worker.registry.ensure_at_least(topic, epoch)
                for topic, part, key_filter in slots:
                    if key_filter is not None:
                        raise NotImplementedError(
                            f"processor {pid} shares {topic}[{part}] by key range; shared tasks "
                            "need more partitions than processors today"
                        )
                    tp = TopicPartition(topic, part)
                    pos = proc.positions.setdefault((topic, part), 0)
                    group_pos = progress.position(topic, part)
                    handlers = self.app.handlers[topic]
                    t = handlers[0].topic
                    layout = self._layout(topic)
                    check = layout is not None and layout.ordered_delivery
                    self.routes[tp] = Route(
                        proc, handlers, _decoder(t.key_serde), _decoder(t.value_serde),
                        (topic, part), max(pos, group_pos), group_pos, layout,
                        str(layout.epoch).encode() if check and layout is not None else None,
                    )
                    self.consumer.seek(tp, pos)
                    starts[(topic, part)] = pos
                    if group_pos > pos:
                        log.info("%s: processor %d rebuilds %s from %d to %d without output",
                                 self.name, pid, tp, pos, group_pos)
            await progress.record(self.name, generation, self.layout_epochs, starts)
            self._next_checkpoint = time.monotonic() + self.app.settings.commit_interval
            await self._fire(self.app.keys_assigned_callbacks)
            await self._regate()
            self.worker.beat()
            log.info("%s: hosts processors %s (generation %d): %s", self.name,
                     sorted(self.processors), generation, sorted(self.routes))
            # A layout change seen during the rebalance may be newer than the one the
            # leader placed by (aiokafka drops a rejoin request made while joining).
            used = assignment.epochs
            for topic, shape in self._shapes().items():
                if shape.epoch > used.get(topic, -1):
                    log.info("%s: assignment used epoch %s of %s, the layout is at %d: rebalancing again",
                             self.name, used.get(topic), topic, shape.epoch)
                    self.consumer._coordinator.request_rejoin()
                    break

    async def _fire(self, callbacks: list[Callable[..., Any]], only: set[TopicPartition] | None = None) -> None:
        if not callbacks:
            return
        for proc in self.processors.values():
            parts = [tp for tp, r in self.routes.items() if r.proc is proc and (only is None or tp in only)]
            if not parts:
                continue
            proc.bind()
            for fn in callbacks:
                result = fn(parts)
                if asyncio.iscoroutine(result):
                    await result

    # -- ordered delivery -------------------------------------------------------------------
    async def _regate(self) -> None:
        """Recompute every gate from the layout and the group's (fenced) positions."""
        self._regate_needed = False
        gated = False
        revoked: set[TopicPartition] = set()
        assigned: set[TopicPartition] = set()
        for topic in self.app.input_topics:
            layout = self._layout(topic)
            mine = {tp.partition: r for tp, r in self.routes.items() if tp.topic == topic}
            if layout is None or not mine:
                continue
            local = {p: r.proc.positions[r.position_key] for p, r in mine.items()}
            group = self.worker.progress.positions(topic)
            for p, pos in local.items():
                group[p] = max(group.get(p, 0), pos)
            tracker = self.trackers.setdefault(topic, GateTracker())
            update = tracker.update(layout, mine, group, local)
            for p, gate in update.state.gates.items():
                tp, route = TopicPartition(topic, p), mine[p]
                if route.layout is not layout:
                    route.layout = layout
                    route.epoch_bytes = str(layout.epoch).encode() if layout.ordered_delivery else None
                pos = local[p]
                if pos < gate.start:  # records below belong to an earlier incarnation
                    if pos > 0:
                        log.warning("%s: skipping offsets %d..%d of %s[%d]: written while it was not ReadWrite, "
                                    "below the start of its current incarnation", self.name, pos, gate.start - 1,
                                    topic, p)
                    route.proc.positions[route.position_key] = pos = gate.start
                    self.consumer.seek(tp, pos)
                limit = gate.start if gate.skip else gate.limit
                if limit is not None and route.limit is None:
                    self.gate_closed_at[tp] = time.monotonic()
                elif limit is None and tp in self.gate_closed_at:
                    waited = time.monotonic() - self.gate_closed_at.pop(tp)
                    self.gate_waits.append((topic, p, waited))
                if limit != route.limit:
                    log.info("%s: %s[%d] at %d: gate %s -> %s%s", self.name, topic, p, pos, route.limit, limit,
                             f" (waiting on {list(gate.waiting_on)})" if gate.waiting_on else "")
                route.limit = limit
                if route.limit is not None and pos >= route.limit:
                    self.consumer.pause(tp)
                    gated = True
                else:
                    self.consumer.resume(tp)
                    gated = gated or route.limit is not None
            revoked.update(TopicPartition(topic, p) for p in update.fire_revoked)
            assigned.update(TopicPartition(topic, p) for p in update.fire_assigned)
        if revoked:  # flush the keys' state, then commit at once: other members wait for it
            await self._fire(self.app.keys_revoked_callbacks, revoked)
            self._next_checkpoint = 0.0
        if assigned:
            await self._fire(self.app.keys_assigned_callbacks, assigned)
        self._gated = gated

    def _cut_at_hole(self, tp: TopicPartition, route: Route, pos: int, records: list[Any]) -> list[Any]:
        """The records before the first hole in their offsets, seeking back to ask for it again.

        Tansu (memory engine) sometimes leaves batches out of a fetch answer while
        producers write the partition; asked again, they are there.  A hole still there
        when asked again at least ``HOLE_CONFIRM_SECONDS`` after it was first seen is real
        (compaction, transaction markers, retention) and read past.
        """
        expected = pos
        for i, r in enumerate(records):
            if r.offset != expected:
                now = time.monotonic()
                seen = route.hole
                if seen is not None and seen[:2] == (expected, r.offset) and now - seen[2] >= HOLE_CONFIRM_SECONDS:
                    route.hole = None  # real: read past it
                else:
                    if seen is None or seen[:2] != (expected, r.offset):
                        route.hole = (expected, r.offset, now)
                        self.holes_refetched += 1
                    self.consumer.seek(tp, expected)
                    return records[:i]
            expected = r.offset + 1
        return records

    def _admit(self, tp: TopicPartition, route: Route, records: list[Any]) -> tuple[list[Any], int | None, list[Any]]:
        """(records to deliver, offset to stop and seek back to or None, late-record reports)."""
        stop_at = None
        limit = route.limit
        if limit is not None and records[-1].offset >= limit:
            # Never back: a gate can close below records already delivered (they came before
            # we saw the change, so they carry our epoch and are safe); it holds from here.
            stop_at = max(limit, records[0].offset)
            records = [r for r in records if r.offset < limit]
        eb = route.epoch_bytes
        if eb is None or not records:
            return records, stop_at, []
        odd = [r for r in records if (h := r.headers) and h[0][1] != eb]
        if not odd:
            return records, stop_at, []
        layout = route.layout
        assert layout is not None
        deliver: list[Any] = []
        late: list[Any] = []
        for r in records:
            epoch = record_epoch(r.headers)
            if epoch is None or epoch == layout.epoch:
                deliver.append(r)
            elif epoch > layout.epoch:  # our layout is stale: stop here, re-read, re-gate
                route.stale_epoch = epoch
                return deliver, r.offset, late
            else:
                verdict = classify_record(layout, tp.partition, r.offset, epoch,
                                          key_hash(r.key) if r.key is not None else None)
                if verdict.violation:
                    producer = dict(r.headers).get("streamkit.producer", b"").decode() or None
                    late.append((r, violation_record(tp.topic, tp.partition, r.offset, r.key, verdict, producer,
                                                     layout_epoch=layout.epoch, group=self.app.group_id)))
                else:
                    deliver.append(r)
        return deliver, stop_at, late

    # -- the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        consumer = self.consumer
        settings = self.app.settings
        while not self._stopping:
            self.awaiting_records = True
            try:
                batch = await consumer.getmany(timeout_ms=100 if self._gated else 200)
            finally:
                self.awaiting_records = False
            if batch:
                async with self.worker.lock:
                    await self._handle(batch)
            now = time.monotonic()
            if self._regate_needed or (self._gated and now >= self._next_gate_poll):
                self._next_gate_poll = now + GATE_POLL_SECONDS
                async with self.worker.lock:
                    if self._gated:
                        await self.worker.progress.refresh()
                    await self._regate()
            if self.processors and (
                self._since_checkpoint >= settings.commit_every or now >= self._next_checkpoint
            ):
                async with self.worker.lock:
                    await self._checkpoint()
                self.worker.beat()
                self._since_checkpoint = 0
                self._next_checkpoint = time.monotonic() + settings.commit_interval

    async def _checkpoint(self) -> None:
        try:
            await checkpointing.checkpoint(self)
        except checkpointing.ZombieCheckpointError as exc:
            self.zombie_rejections += 1
            log.error("%s: %s; dropping uncommitted state and rejoining", self.name, exc)
            self._close_all(discard=True)
            self.consumer._coordinator.request_rejoin()

    async def _handle(self, batch: dict[TopicPartition, list[Any]]) -> None:
        self.app.clock.ctx = self.ctx
        stale: dict[str, int] = {}
        for tp, fetched in batch.items():
            route = self.routes.get(tp)
            if route is None or not fetched:
                continue  # fetched before a rebalance took the partition away
            proc = route.proc
            pos = proc.positions[route.position_key]
            records = fetched
            if records[0].offset < pos:
                records = [r for r in records if r.offset >= pos]
                if not records:
                    continue
            if records[0].offset != pos or records[-1].offset - pos != len(records) - 1:
                records = self._cut_at_hole(tp, route, pos, records)
                if not records:
                    continue
            checked = records
            records, stop_at, late = self._admit(tp, route, records)
            if records:
                proc.bind()
                self.ctx.processor = proc.id
                if records[0].offset < route.rebuild_until:
                    replay = [r for r in records if r.offset < route.rebuild_until]
                    records = records[len(replay):]
                    self.outbox.suppress = True
                    await self._run_records(replay, route, rebuilding=True)
                    self.outbox.suppress = False
                if records:
                    await self._run_records(records, route, rebuilding=False)
            for rec, report in late:
                await self.output.dead_letter(rec, "ordering-violation", orjson.dumps(report).decode())
            next_pos = stop_at if stop_at is not None else checked[-1].offset + 1
            proc.positions[route.position_key] = next_pos
            if stop_at is not None:
                self.consumer.seek(tp, stop_at)
                if route.limit is not None and stop_at >= route.limit:
                    self.consumer.pause(tp)
                    self._gated = True
            if route.stale_epoch is not None:
                stale[tp.topic] = max(stale.get(tp.topic, 0), route.stale_epoch)
                route.stale_epoch = None
            n = len(checked)
            proc.uncommitted += n
            self._since_checkpoint += n
            self.handled += n
        if self.outbox.items:
            items, self.outbox.items = self.outbox.items, []
            for topic, key, value, headers in items:
                await self.output.send(topic, key, value, headers)
        if stale:
            for topic, epoch in stale.items():
                await self.worker.registry.ensure_at_least(topic, epoch)
            await self._regate()

    async def _run_records(self, records: list[Any], route: Route, rebuilding: bool) -> None:
        kl, vl, ctx = route.key_loads, route.value_loads, self.ctx
        failures: list[tuple[Any, str, BaseException, str]] = []
        for spec in route.handlers:
            fn, is_async = spec.fn, spec.is_async
            for rec in records:
                try:
                    k = rec.key
                    if k is not None:
                        k = kl(k)
                    v = rec.value
                    if v is not None:
                        v = vl(v)
                except Exception as exc:  # noqa: BLE001 - any decode error is a dead letter
                    failures.append((rec, _decode_reason(rec, kl, exc), exc, ""))
                    continue
                ctx._rec = rec
                try:
                    result = fn(k, v, ctx)
                    if is_async:
                        await result
                except Exception as exc:  # noqa: BLE001 - user code
                    failures.append((rec, "handler", exc, spec.name))
        if failures:
            await self._failed(failures, len(records) * len(route.handlers), rebuilding)
        else:
            self.consecutive_failures = 0

    async def _failed(
        self, failures: list[tuple[Any, str, BaseException, str]], attempts: int, rebuilding: bool
    ) -> None:
        if not rebuilding:  # a rebuilt record's dead letter was sent when it was first handled
            seen: set[tuple[int, str]] = set()
            for rec, reason, exc, handler in failures:
                if reason != "handler" and (rec.offset, reason) in seen:
                    continue  # a decode failure is reported once, not once per handler
                seen.add((rec.offset, reason))
                await self.output.dead_letter(rec, reason, exc, handler)
        if len(failures) == attempts:
            self.consecutive_failures += attempts
        else:
            self.consecutive_failures = 0
        threshold = self.app.settings.failure_alarm_after
        now = time.monotonic()
        if self.consecutive_failures >= threshold and now - self._last_alarm > 10:
            self._last_alarm = now
            rec, reason, exc, handler = failures[-1]
            log.error(
                "%s: the last %d records all failed (%s in %s at %s[%d]@%d: %s: %s); they go to "
                "%s, but the job is not doing useful work",
                self.name, self.consecutive_failures, reason, handler or "decoding", rec.topic,
                rec.partition, rec.offset, type(exc).__name__, exc, self.app.dead_letter_topic,
            )

    def request_stop(self) -> None:
        """Leave the loop after the current batch."""
        self._stopping = True

    async def stop(self, checkpoint: bool = True) -> None:
        """Checkpoint (unless told not to: after a failure mid-batch), close stores, leave."""
        async with self.worker.lock:
            self._stopping = True
            if self.processors and checkpoint:
                await self._fire(self.app.keys_revoked_callbacks)
                await self._checkpoint()
            self._close_all(discard=not checkpoint)
        await self.consumer.stop()


def _decode_reason(rec: Any, key_loads: Callable[[bytes], Any], exc: BaseException) -> str:
    if rec.key is not None:
        try:
            key_loads(rec.key)
        except Exception:  # noqa: BLE001
            return "key-decode"
    return "value-decode"
