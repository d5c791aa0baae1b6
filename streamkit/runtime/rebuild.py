"""Rebuild a processor's state from the input history, without output.

A processor's keys may have records in every partition that ever held them: the
partitions that hold them now (S1), the partitions those were split from, partitions a
shrink drained into them (given up since or not), and earlier incarnations of
partitions created again by a later expansion (together: S2). A rebuild reads all of
S2 from the store's positions (T2: 0 for a new store) up to a target per partition
(T1: the group's position, for the partitions the processor consumes and for the others
alike: beyond it, the group has not handled the records yet, and whoever takes them
over must, with output), and applies only the processor's keys:

- in each key's order across partitions: the gates of the whole history
  (``gating.compute_gate(history=True)``) hold a partition until the partitions its
  keys came from are read to their seals, with this reader's own positions;
- with no output, no dead letters (sent when the records were first handled) and no
  timers (the processor is not hosted yet);
- never from a history that is no longer all there: a partition whose log starts above
  the store's position (retention, deleted records) refuses the rebuild
  (``HistoryTruncatedError``) rather than build incomplete state;
- checkpointing the store as it goes, marked as a rebuild in progress, so that a
  rebuild killed midway resumes from where it got (T2), and the processor does not
  take its partitions over with half its state;
- with exactly-once input, reading on past a target for commit markers only, where the
  commit gate holds records below it: the group decided them (it handled them), by
  markers that may lie beyond its position.

The fetching goes through ``KafkaIO`` (holes asked for again); admission is the
worker's and the records are applied by a task (``task.Task``) over the member's own
dispatcher, so a rebuilt record is admitted and applied exactly as a live one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import TopicPartition

from assignors.linear_hashing import bucket_modulus
from assignors.placement import KeyFilter, partitions_for_processor, processor_key_sources, processors_for_partition
from stores.base import Checkpoint
from streamkit.app import HandlerSpec
from streamkit.checkpoint_keys import REBUILD_MARK
from streamkit.errors import HistoryTruncatedError
from streamkit.exactly_once.markers import is_marker
from streamkit.joins.merge import TimeMerge
from streamkit.kafkaio import KafkaIO
from streamkit.layout.model import TopicLayout
from streamkit.layout.registry import LayoutRegistry
from streamkit.layout.strays import SweepEnds, in_place_until, plain_rule
from streamkit.runtime.admission import Admission, Admitted
from streamkit.runtime.checkpointing import Stamp
from streamkit.runtime.dispatch import Dispatcher
from streamkit.runtime.epochs import catch_up_epochs
from streamkit.runtime.merging import HELD_PER_PARTITION
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.routes import Route, mixed_history_end, sealed_history_end
from streamkit.runtime.task import Task

log = logging.getLogger(__name__)

STALL_SECONDS = 60.0


@dataclass
class RebuildPlan:
    """What a rebuild of processor ``processor`` reads, and up to where."""

    processor: int
    key_filter: KeyFilter
    targets: dict[TopicPartition, int] = field(default_factory=dict)
    """Per partition of S2: read offsets below this."""
    owned: set[TopicPartition] = field(default_factory=set)
    """S1: the partitions the processor consumes."""
    output_from: dict[TopicPartition, int] = field(default_factory=dict)
    """Per partition, where the group stopped handling the processor's keys: records from
    here on are applied with output (absent: none, the group handled everything)."""
    keyless: set[TopicPartition] = field(default_factory=set)
    """The partitions of S1 whose keyless records are its own (whole ones, and shared
    ones where it is the lowest sharer)."""
    plain: dict[str, int] = field(default_factory=dict)
    """The plain topics (no layout) read, with their partition counts: their routes take
    the plain rule, as the member's do, so that a stray forwarded twice (by a sweep killed
    before its checkpoint) is applied once, and the seen strays are rebuilt as they go."""

    @property
    def records(self) -> int:
        return sum(self.targets.values())


def rebuild_unfinished(loaded: Checkpoint) -> bool:
    """The store's last checkpoint was written by a rebuild that did not finish."""
    return bool(loaded.extra.get(REBUILD_MARK))


def high_water(layout: TopicLayout) -> int:
    """The largest active partition count in the topic's history."""
    return max([layout.active, *(max(s.old_active, s.new_active) for s in layout.seals)])


async def plan_rebuild(
    io: KafkaIO,
    processor: int,
    p0: int,
    p: int,
    topics: Mapping[str, tuple[TopicLayout | None, int]],
    group_position: Callable[[str, int], int],
) -> RebuildPlan:
    """The plan of a rebuild of ``processor`` (job ``p0 -> p``).

    ``topics``: per input topic, its layout (None: a plain topic) and physical count.
    ``group_position(topic, partition)``: where the group is (T1).
    """
    plan = RebuildPlan(processor, KeyFilter(bucket_modulus(processor, p0, p), frozenset({processor})))
    for topic, (layout, physical) in sorted(topics.items()):
        n0, n = (layout.n0, layout.active) if layout is not None else (physical, physical)
        if layout is None:
            plan.plain[topic] = physical
        high = {topic: high_water(layout)} if layout is not None else None
        owned = set(partitions_for_processor(processor, n0, n, p0, p))
        sources = processor_key_sources(processor, {topic: (n0, n)}, p0, p, high_water=high)[topic]
        ends = await io.high_watermarks(topic, sorted(sources))
        for part in sorted(sources):
            tp = TopicPartition(topic, part)
            target = min(group_position(topic, part), ends[part])
            if part in owned:
                plan.owned.add(tp)
                if min(processors_for_partition(part, n0, n, p0, p)) == processor:
                    plan.keyless.add(tp)
            elif layout is not None and (sealed := mixed_history_end(layout, part)) is not None:  # none beyond
                target = min(target, sealed)
            plan.targets[tp] = target
    return plan


def plan_left_history(
    processor: int,
    p0: int,
    p: int,
    positions: Mapping[tuple[str, int], int],
    owned: set[tuple[str, int]],
    layouts: Mapping[str, TopicLayout | None],
    handled: Mapping[tuple[str, int], int] | None = None,
) -> RebuildPlan:
    """What a processor must still read of partitions it does not consume: below a seal,
    such a partition holds records of this processor's keys that it may not have applied
    yet (one it shared until a topic expansion split it; or, for a processor that just
    joined, one its keys' old owner had not read to the seal when it let go of them). They
    are read up to the seal with its key filter, before its own partitions deliver
    anything (per-key order), with output from its own position there (below it, its
    checkpoints flushed the output; the group's position of the partition is the new
    owner's now, and says nothing of this processor's keys), or from ``handled`` (where
    the keys' old owner had handled them to) if that is further."""
    plan = RebuildPlan(processor, KeyFilter(bucket_modulus(processor, p0, p), frozenset({processor})))
    for (topic, part), pos in sorted(positions.items()):
        layout = layouts.get(topic)
        if (topic, part) in owned or layout is None:
            continue
        # a later change announced and not sealed leaves what lies below the earlier seals
        # as settled as before: read it now (the gates of this processor's own partitions
        # look at their new owners' positions, not at this processor's keys)
        end = sealed_history_end(layout, part)
        end = in_place_until(layout, part, pos, end)  # strays are the sweep's to forward, not a catch-up's
        if pos >= end:
            continue
        high = {topic: high_water(layout)}
        if part in processor_key_sources(processor, {topic: (layout.n0, layout.active)}, p0, p, high_water=high)[topic]:
            tp = TopicPartition(topic, part)
            plan.targets[tp] = end
            plan.output_from[tp] = max(pos, (handled or {}).get((topic, part), 0))
    return plan


def history_gaps(
    plan: RebuildPlan, positions: Mapping[tuple[str, int], int], starts: Mapping[TopicPartition, int]
) -> dict[TopicPartition, tuple[int, int]]:
    """The partitions of ``plan`` whose log starts above where the store is (T2), with both
    offsets: the records in between are gone, and a rebuild would miss them."""
    gaps = {}
    for tp in sorted(plan.targets):
        at, start = positions.get((tp.topic, tp.partition), 0), starts.get(tp, 0)
        if start > at and plan.targets[tp] > at:
            gaps[tp] = (start, at)
    return gaps


def truncated_message(processor: int, gaps: Mapping[TopicPartition, tuple[int, int]]) -> str:
    where = ", ".join(
        f"{tp.topic}[{tp.partition}] starts at offset {s}, the store is at {t2}" for tp, (s, t2) in gaps.items()
    )
    return (
        f"the input history that processor {processor}'s state is rebuilt from is gone ({where}); "
        "seed its store from a copy of the history with a Spark backfill (streamkit backfill)"
    )


async def check_history(io: KafkaIO, plan: RebuildPlan, positions: Mapping[tuple[str, int], int]) -> None:
    """Refuse (``HistoryTruncatedError``) a rebuild whose history is no longer all there."""
    starts: dict[TopicPartition, int] = {}
    for topic in sorted({tp.topic for tp in plan.targets}):
        parts = [tp.partition for tp in plan.targets if tp.topic == topic]
        starts.update({TopicPartition(topic, p): s for p, s in (await io.log_start_offsets(topic, parts)).items()})
    gaps = history_gaps(plan, positions, starts)
    if gaps:
        raise HistoryTruncatedError(truncated_message(plan.processor, gaps))


class _Reader:
    """What admission drives, for a reader that fetches by itself: pause and resume flags
    (a seek goes where the route's position already is: the next fetch starts there)."""

    def __init__(self) -> None:
        self.paused: set[TopicPartition] = set()

    def pause(self, *partitions: TopicPartition) -> None:
        self.paused.update(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self.paused.difference_update(partitions)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        pass


@dataclass(frozen=True)
class HistoryReader:
    """What a rebuild reads history through and applies it with: the member's own parts,
    so that a rebuilt record is admitted and applied exactly as a live one."""

    io: KafkaIO
    registry: LayoutRegistry
    handlers: Mapping[str, list[HandlerSpec]]
    dispatcher: Dispatcher
    group: str
    sweep_ends: SweepEnds | None = None
    """Where the group's sweeps of activated partitions ended (``ProgressLog.sweep_ends``)."""

    def task(self, proc: ProcessorState) -> Task:
        """A task over ``proc`` for a history: its merge waits for nothing but the exact lag
        of what is left to read (``rebuild`` says which topic lags)."""
        return Task(proc, self.dispatcher, TimeMerge(0))


@dataclass(frozen=True)
class Pace:
    """When a rebuild checkpoints, how fast it reads, and who is told."""

    stamp: Stamp
    """The layout epochs and generation its checkpoints are stamped with."""
    checkpoint_every: int
    """Records between checkpoints (a restart goes on from the last)."""
    extra: Mapping[str, Any] | None = None
    """What goes into each checkpoint's extra (the processor count)."""
    lock: asyncio.Lock | None = None
    """Taken around each batch applied and each checkpoint (a rebuild running beside the
    member's own loop: a bootstrap)."""
    checkpoint_interval: float | None = None
    """Seconds between checkpoints, too."""
    max_rate: float | None = None
    """Records/s at most."""
    on_checkpoint: Callable[[int], None] | None = None
    """Called with the records read after each checkpoint before the last."""
    before_checkpoint: Callable[[], Awaitable[None]] | None = None
    """Called before each checkpoint (the output of ``plan.output_from`` records is
    acknowledged before their positions are written)."""


async def rebuild(reader: HistoryReader, task: Task, plan: RebuildPlan, pace: Pace) -> int:
    """Apply ``plan`` to ``task``'s state (see the module docstring) as ``pace`` says;
    returns the records read. ``task`` reads the plan's partitions (``HistoryReader.task``)."""
    io, registry, handlers, proc = reader.io, reader.registry, reader.handlers, task.proc
    group, sweep_ends, stamp, extra, lock = reader.group, reader.sweep_ends, pace.stamp, pace.extra, pace.lock
    checkpoint_every, checkpoint_interval, max_rate = pace.checkpoint_every, pace.checkpoint_interval, pace.max_rate
    on_checkpoint, before_checkpoint = pace.on_checkpoint, pace.before_checkpoint
    assert not task.routes, "a history reader's task reads the plan's partitions only (HistoryReader.task)"
    await check_history(io, plan, proc.positions)
    guard = lock if lock is not None else contextlib.nullcontext()
    fetcher = _Reader()
    admission = Admission(
        fetcher, group=group, name=f"rebuild of processor {proc.id}", seal=registry.origin_seal, sweep_ends=sweep_ends
    )
    for tp, target in plan.targets.items():
        handled = plan.output_from.get(tp, target)
        route = Route.build(
            proc, handlers[tp.topic], (tp.topic, tp.partition), handled, registry.get(tp.topic),
            admission.sweep_ends(tp.topic, tp.partition),
        )  # fmt: skip
        if route.strays is None and tp.topic in plan.plain:
            route.strays = plain_rule(tp.partition, plan.plain[tp.topic])
        route.key_filter = plan.key_filter
        route.null_keys = tp in plan.keyless
        admission.add(tp, route)
        task.read(tp, route)
    # The inputs in time order as live: a partition short of its target may bring an
    # earlier record; what is held when every target is reached is applied then.
    # (A partition at its gate's limit brings nothing until the gate opens: it does not lag.)
    # (A partition whose commit gate holds records below its target lags too, while its
    # markers are read on past it: ``MarkersPast``.)
    past = MarkersPast(io, task)
    task.lagging = task.gated(
        lambda _pid, source: any(
            r.position_key == source
            and r.position < plan.targets[tp]
            and tp not in fetcher.paused
            and (r.limit is None or r.position < r.limit)
            for tp, r in admission
        ),
        undecided=past.ended,
    )
    read = since_checkpoint = 0
    started = last_checkpoint = last_progress = time.monotonic()
    misses: dict[TopicPartition, int] = {}
    while True:
        admission.regate(registry.get, lambda _topic: {}, history=True)
        todo = [(tp, r) for tp, r in admission if r.position < plan.targets[tp]]
        deciding = [(tp, r) for tp, r in admission if r.position >= plan.targets[tp] and past.wanted(tp, r)]
        if not todo and not deciding:
            break
        for tp, route in deciding:
            if await past.read(tp, route, guard):
                last_progress = time.monotonic()
        if todo and all(tp in fetcher.paused for tp, _ in todo):
            # Held by gates whose blockers are read to their targets: the group itself
            # is short of a seal there; the member goes on from these positions.
            held = {f"{tp.topic}[{tp.partition}]": (r.position, r.limit) for tp, r in todo}
            log.warning("rebuild of processor %d stops short of its targets, held by gates: %s", proc.id, held)
            break
        moved = False
        for tp, route in todo:
            if tp in fetcher.paused or task.merge.queued(proc.id, route.position_key) > HELD_PER_PARTITION:
                continue  # (held records of a partition far ahead in time: read on once they went out)
            target = plan.targets[tp]
            # The test broker answers with what it gathered within max_wait_ms, down to
            # nothing on a busy machine: wait longer after an empty answer.
            wait_ms = min(200, 1 + 20 * misses.get(tp, 0))
            records, _ = await io.fetch(tp.topic, tp.partition, route.position, max_wait_ms=wait_ms)
            misses[tp] = 0 if records else misses.get(tp, 0) + 1
            records = [r for r in records if r.offset < target]
            for route, batch in admission.admit(tp, records):  # one route per partition here
                async with guard:
                    await task.apply(route, batch)
                read += batch.consumed
                since_checkpoint += batch.consumed
                moved = moved or batch.consumed > 0
            if max_rate is not None and (ahead := read / max_rate - (time.monotonic() - started)) > 0:
                await asyncio.sleep(ahead)
        if task.merge.held:
            async with guard:
                await task.release()
        await catch_up_epochs(admission, registry)
        due = checkpoint_interval is not None and time.monotonic() - last_checkpoint >= checkpoint_interval
        if since_checkpoint >= checkpoint_every or (due and since_checkpoint):
            async with guard:
                if before_checkpoint is not None:
                    await before_checkpoint()
                _checkpoint(task, stamp, extra, done=False)
            since_checkpoint, last_checkpoint = 0, time.monotonic()
            if on_checkpoint is not None:
                on_checkpoint(read)
        if moved:
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > STALL_SECONDS:
            waiting = {f"{tp.topic}[{tp.partition}]": (r.position, r.limit) for tp, r in todo}
            raise RuntimeError(
                f"rebuild of processor {proc.id} made no progress for {STALL_SECONDS:.0f} s "
                f"(partition: (position, gate)): {waiting}"
            )
        else:
            await asyncio.sleep(0.01)
    async with guard:
        await task.release(flush=True)
        past.forget()
        if before_checkpoint is not None:
            await before_checkpoint()
        _checkpoint(task, stamp, extra, done=True)
    return read


class MarkersPast:
    """A rebuild's reads past a partition's target for exactly-once commit markers only:
    a record below the target that the commit gate holds was decided by the group (it
    handled it, or its position would be below it) with a marker that may lie beyond the
    target. The records there are left to whoever reads on (the route's position stays at
    the target, and the commit gate's table is checkpointed as of the stable offset,
    without what it learned past it). A partition read to its end with records still
    held (their attempt is not decided yet: a target beyond the group's position, such as
    a partition's end) is left as it is: its records stay pending, to be read again."""

    def __init__(self, io: KafkaIO, task: Task) -> None:
        self.io, self.task = io, task
        self.at: dict[TopicPartition, int] = {}
        self.routes: dict[TopicPartition, Route] = {}
        self.ended: set[tuple[str, int]] = set()
        """Sources read to their end past the target with records still held."""

    def wanted(self, tp: TopicPartition, route: Route) -> bool:
        gate = self.task.proc.commit_gate
        return gate is not None and gate.holds(route.position_key) and route.position_key not in self.ended

    async def read(self, tp: TopicPartition, route: Route, guard: contextlib.AbstractAsyncContextManager[Any]) -> bool:
        """One fetch past the target, its markers applied under ``guard``; whether it read
        anything."""
        at = self.at.get(tp, route.position)
        records, high = await self.io.fetch(tp.topic, tp.partition, at, max_wait_ms=50)
        if records:
            self.at[tp] = records[-1].offset + 1
            if markers := [r for r in records if is_marker(r)]:
                async with guard:
                    await self.task.apply(route, Admitted([], markers, [], [], route.position, 0))
        elif 0 <= high <= at:
            self.ended.add(route.position_key)
        self.routes[tp] = route
        return bool(records)

    def forget(self) -> None:
        """At the rebuild's end: the commit gate forgets the markers read past the targets
        (whoever reads on from a target, the processor's live routes, reads them again in
        their turn: a recovery marker learned early would abort the records before it)."""
        proc = self.task.proc
        if (gate := proc.commit_gate) is None:
            return
        for route in self.routes.values():
            source, target = route.position_key, route.position
            gate.forget_from(source, target)
            if pending := proc.pending.get(source):  # (the markers past it were pending while queued)
                pending.difference_update([o for o in pending if o >= target])


def _checkpoint(task: Task, stamp: Stamp, extra: Mapping[str, Any] | None, *, done: bool) -> None:
    epochs, generation = stamp()
    task.commit(task.checkpoint_record(epochs, generation, dict(extra or {}) | ({} if done else {REBUILD_MARK: True})))
