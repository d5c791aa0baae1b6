"""The commit sequence, written down once.

0. Read the group's progress log: if a newer generation owns one of the member's
   partitions, the member is a zombie (paused through a rebalance) and its checkpoint
   is rejected: nothing of it is written (`ZombieCheckpointError`).
1. Output and dead letters of every handled record are acknowledged by the broker.
2. Each processor appends its state changes and a marker holding its checkpoint to the
   job's changelog (if the app has one; ``streamkit.state.changelog``), then writes its
   state changes and its input positions (per partition the stable offset and the IC
   ranges applied beyond it, `icranges`), stamped with the
   layout epochs and the group generation, in one atomic store batch (the checkpoint).
   A stamp older than the store's is refused (`ZombieError`). After a crash, reopening
   gives exactly the state of having applied every record before those positions once.
   2b. With ``processing="exactly_once"``, each processor's output attempt is in that
   batch: its commit markers go out now (``streamkit.exactly_once.writer``). A crash
   before they do leaves the attempt committed without markers: the processor's next
   incarnation announces it.
   2c. Sink rows (``streamkit.sinks``) are in that batch too: each sink writes them now,
   in one transaction with how far their processor got (a crash before that: the
   processor's next incarnation writes them, the sink skips what it holds).
3. The positions are recorded in the progress log (generation-fenced: what gating and
   rebuilding hosts read) and committed as the group's Kafka offsets (what tools read;
   for a shared partition, the lowest of its sharers' positions in the progress log).
   A crash between 2 and 3 leaves the group behind the store, never ahead: the store
   wins on restart.

`checkpoint` receives every part it uses and returns the positions it committed; it
writes nothing into its caller.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import OffsetAndMetadata

from stores.base import Checkpoint
from streamkit.errors import StreamkitError
from streamkit.layout.epochs import ZombieError, check_stamp
from streamkit.runtime import icranges
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.progress import Commit, ProgressLog
from streamkit.runtime.task import Task
from streamkit.state.changelog import (
    CHANGELOG_POSITION,
    ChangelogWriter,
    position_of,
    snapshot_changes,
)
from streamkit.windows import STREAM_TIME_KEY

log = logging.getLogger(__name__)

CommitOffsets = Callable[[dict[TopicPartition, OffsetAndMetadata]], Awaitable[None]]
Stamp = Callable[[], tuple[Mapping[str, int], int]]
"""The layout epochs and generation a processor's checkpoints are stamped with, when asked
(a catch-up's, a rebuild's, a bootstrap's)."""


class ZombieCheckpointError(StreamkitError):
    """A newer generation of the group owns partitions this member still processes."""


@dataclass(frozen=True)
class Slot:
    """One assigned partition of one processor, as the commit sequence sees it."""

    tp: TopicPartition
    proc: ProcessorState
    committed: int
    """The group's committed offset for this processor, as last known."""
    sharers: tuple[int, ...] = ()
    """Every processor sharing the partition by key range (empty: a whole partition)."""
    swept: bool = False
    """The processor only sweeps the partition (forwards its strays, applies nothing)."""
    copies_until: int = 0
    """Copies of the partition's strays that a dead sweep forwarded lie below this offset
    of it (a sweep's position at or beyond it has no copy beyond it)."""
    kafka_offset: int = -1
    """The partition's Kafka offset this member committed last (-1: none yet)."""


def prepare_checkpoints(
    tasks: Iterable[Task],
    epochs: Mapping[str, int],
    generation: int,
    extra: Mapping[str, Any] | None,
    *,
    changelog: bool = False,
) -> list[tuple[ProcessorState, Checkpoint]]:
    """Step 2's checkpoints (``Task.checkpoint_record``), for every task that moved
    (expired windows deleted first: their deletions are part of it). Every stamp is
    checked before any store is written: all or none (``ZombieCheckpointError``).
    ``changelog``: a task whose store is not in the changelog yet moved (its snapshot is
    due)."""
    writes: list[tuple[ProcessorState, Checkpoint]] = []
    for task in tasks:
        proc = task.proc
        proc.expire_windows()  # deletions go into this checkpoint's batch
        new = task.checkpoint_record(epochs, generation, extra or {})
        loaded_marks = {k: v for k, v in proc.loaded.extra.items() if k != CHANGELOG_POSITION}
        moved = proc.uncommitted or proc.positions != proc.loaded.positions or new.extra != loaded_marks
        unlogged = changelog and position_of(proc.loaded) is None
        if moved or unlogged or any(c.dirty_count for c in proc.caches.values()):  # a timer's writes too
            try:
                check_stamp(proc.loaded, new, what=f"checkpoint of processor {proc.id}")
            except ZombieError as exc:  # a newer generation wrote the store: fenced, like step 0
                raise ZombieCheckpointError(str(exc)) from None
            writes.append((proc, new))
    return writes


def commit_stores(
    tasks: Iterable[Task], epochs: Mapping[str, int], generation: int, extra: Mapping[str, Any] | None
) -> None:
    """Step 2 without a changelog: state changes and positions in one atomic batch per
    store (``prepare_checkpoints``)."""
    for proc, new in prepare_checkpoints(tasks, epochs, generation, extra):
        proc.commit(new)


async def log_and_commit_stores(
    writes: list[tuple[ProcessorState, Checkpoint]], changelog: ChangelogWriter | None
) -> None:
    """Step 2 with the changelog first: per processor, its changes (or its whole state,
    if its store is not in the changelog yet) and a marker holding the checkpoint, then
    the store batch recording the changelog position after the marker. A crash between
    the two leaves the store at its previous checkpoint; the next one builds on that.
    Each change is serialised once: into the store's batch, built before the changelog
    write, and the changelog's records as it goes in. The processors' changelog writes
    go at once (each is two round trips: its changes acknowledged, then its marker), the
    snapshots one by one (each holds a whole state in memory until it is written)."""
    if changelog is None:
        for proc, new in writes:
            proc.commit(new)
        return
    incremental = [(proc, new) for proc, new in writes if position_of(proc.loaded) is not None]
    for proc, new in writes:
        if position_of(proc.loaded) is None:
            await _log_and_commit(proc, new, changelog)
    # every one runs to its end before a failure is raised: none writes its store batch
    # after the caller has seen the error and let go of the lock
    done = await asyncio.gather(*(_log_and_commit(proc, new, changelog) for proc, new in incremental),
                                return_exceptions=True)  # fmt: skip
    for outcome in done:
        if isinstance(outcome, BaseException):
            raise outcome


async def _log_and_commit(proc: ProcessorState, new: Checkpoint, changelog: ChangelogWriter) -> None:
    base = position_of(proc.loaded)
    records = changelog.records()
    if base is None:  # a snapshot: the keys the caches did not change, then theirs (no key twice)
        for key, value in snapshot_changes(proc.store, proc.caches):
            records.add(key, value)
    prepared = proc.prepare_commit(records.add)
    position = await changelog.send(proc.id, records, new, base=base)
    proc.finish_commit(prepared, new.replace(extra={**new.extra, CHANGELOG_POSITION: position}))


async def _commit_kafka(
    member: str,
    progress: ProgressLog,
    partitions: Iterable[TopicPartition],
    generation: int,
    epochs: Mapping[str, int],
    commit_offsets: CommitOffsets,
) -> None:
    """Step 3: the group positions as Kafka offsets (what tools read)."""
    meta = orjson.dumps({"gen": generation, "epochs": dict(epochs)}).decode()
    offsets = {tp: OffsetAndMetadata(o, meta) for tp in partitions if (o := progress.position(tp.topic, tp.partition))}
    try:
        if offsets:  # a shared partition's position waits for every sharer's first commit
            await commit_offsets(offsets)
    except (CommitFailedError, IllegalStateError, KafkaError) as exc:
        # The store and the progress log hold the checkpoint; Kafka catches up next time.
        log.warning("member %s: Kafka offset commit failed (%s); checkpoint kept", member, exc)


@dataclass(frozen=True)
class CheckpointStamp:
    """Whose checkpoint it is: what every store checkpoint and progress record carries."""

    member: str
    """The member, in log lines and progress records."""
    generation: int
    layout_epochs: Mapping[str, int]
    extra: Mapping[str, Any] | None = None
    """What goes into every store checkpoint (the job's processor count)."""


@dataclass(frozen=True)
class CheckpointSinks:
    """What the commit sequence writes through, handed to it (quixstreams' collaborators)."""

    progress: ProgressLog
    flush_output: Callable[[], Awaitable[None]]
    """Wait until the output sent so far is acknowledged."""
    commit_offsets: CommitOffsets
    changelog: ChangelogWriter | None = None
    """The job's changelog (None: the app has none)."""
    commit_attempts: Callable[[Iterable[Task]], Awaitable[None]] | None = None
    """Step 2b: the tasks' exactly-once markers, once their stores hold their attempts
    (None: output at least once)."""
    commit_rows: Callable[[Iterable[Task]], Awaitable[None]] | None = None
    """Step 2c: every task's sink rows its store holds and no sink is known to hold, to
    their sinks (None: the app has no sink)."""


async def checkpoint(
    stamp: CheckpointStamp, tasks: Iterable[Task], slots: Iterable[Slot], sinks: CheckpointSinks
) -> dict[tuple[TopicPartition, int], int]:
    """Steps 0-3 above for one member; returns the positions committed per (partition,
    processor), beyond the last known commit of each.

    ``slots``: the assigned partitions (only those whose processor moved past its last
    commit are committed).
    """
    member, generation, layout_epochs, extra = stamp.member, stamp.generation, stamp.layout_epochs, stamp.extra
    progress, flush_output, commit_offsets, changelog = (
        sinks.progress, sinks.flush_output, sinks.commit_offsets, sinks.changelog
    )  # fmt: skip
    tasks = list(tasks)
    if not tasks:
        return {}
    t0 = time.monotonic()
    slots = list(slots)
    parts = sorted({(s.tp.topic, s.tp.partition) for s in slots})
    await progress.refresh()
    newest = progress.newest_generation(parts)
    if newest > generation:
        raise ZombieCheckpointError(
            f"checkpoint of generation {generation} rejected: generation {newest} owns some of "
            f"{sorted(parts)} (this member was paused through a rebalance)"
        )
    t1 = time.monotonic()
    await flush_output()
    t2 = time.monotonic()
    epochs = dict(layout_epochs)
    writes = prepare_checkpoints(tasks, epochs, generation, extra, changelog=changelog is not None)
    await log_and_commit_stores(writes, changelog)
    if sinks.commit_attempts is not None:
        await sinks.commit_attempts(tasks)
    if sinks.commit_rows is not None:
        await sinks.commit_rows(tasks)
    committed: dict[tuple[TopicPartition, int], int] = {}
    whole: dict[tuple[str, int], int | None] = {}
    shares: dict[tuple[str, int, int], tuple[int | None, tuple[int, ...]]] = {}
    ic: dict[tuple[str, int, int], tuple[int, str]] = {}
    for slot in slots:
        key = (slot.tp.topic, slot.tp.partition)
        pos = slot.proc.loaded.positions.get(key)  # the stable offset
        if pos is not None and (applied := slot.proc.loaded.ic_ranges.get(key)):
            ic[(*key, slot.proc.id)] = (pos, icranges.encode(pos, applied))
        if pos is not None and pos > slot.committed:
            committed[(slot.tp, slot.proc.id)] = pos
            if slot.sharers:
                shares[(slot.tp.topic, slot.tp.partition, slot.proc.id)] = (pos, slot.sharers)
            else:
                whole[(slot.tp.topic, slot.tp.partition)] = pos
    t3 = time.monotonic()
    # Kafka's offsets catch up while idle: a partition whose group position (the progress
    # log's) has passed what this member committed to Kafka in this generation is
    # committed again, even with nothing new. Every sharer commits a shared partition's
    # group position (the lowest of the sharers'), each from its own view of the progress
    # log, so a commit computed from an older view can land last. A whole partition is
    # committed again only at its processor's own checkpointed position (never another
    # member's view): a commit that failed in a rebalance (the checkpoint kept in the
    # store and the progress log) would else wait for the partition's next record, for
    # ever on a drained or quiet partition.
    behind = {
        s.tp
        for s in slots
        if (group := progress.position(s.tp.topic, s.tp.partition))
        and group > s.kafka_offset
        and (s.sharers or s.proc.loaded.positions.get((s.tp.topic, s.tp.partition)) == group)
    }
    if not committed and not ic:
        if behind:
            await _commit_kafka(member, progress, behind, generation, epochs, commit_offsets)
        return committed
    swept = [(s.tp.topic, s.tp.partition) for s in slots if s.swept]
    clean = [
        k for s in slots if s.swept and (o := whole.get(k := (s.tp.topic, s.tp.partition))) and o >= s.copies_until
    ]
    times = {  # what a processor taking a whole partition over goes on from: closes sent up to there
        (s.tp.topic, s.tp.partition): min(int(at), s.proc.fired_through)
        for s in slots
        if not s.sharers and not s.swept and (at := s.proc.loaded.extra.get(STREAM_TIME_KEY)) is not None
    }
    commit = Commit(whole, shares, ic, swept=swept, no_copies_beyond=clean, stream_times=times)
    await progress.record(member, generation, epochs, commit)
    t4 = time.monotonic()
    await _commit_kafka(member, progress, {tp for tp, _ in committed} | behind, generation, epochs, commit_offsets)
    t5 = time.monotonic()
    if t5 - t0 > 0.5:
        log.warning(
            "slow checkpoint %s: progress %.3f flush %.3f store %.3f record %.3f kafka %.3f",
            member,
            t1 - t0,
            t2 - t1,
            t3 - t2,
            t4 - t3,
            t5 - t4,
        )
    return committed
