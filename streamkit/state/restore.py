"""Rebuild a processor's store from its changelog partition (``streamkit.state.changelog``).

1. Read the partition to its end.
2. Take the chain's head: the newest marker of the newest generation (an older
   generation's markers written later are a zombie's).
3. Follow the bases back to a snapshot or the partition's first batch: the batches on
   the chain, in order.
4. Apply their records, nothing else, keeping the processor's keys only (a store
   written for fewer processors held keys that moved away since; their new owner's
   changelog has them).
5. Commit the state and the head's checkpoint, with the changelog position after the
   head, in one store batch: a kill at any instant leaves no store, or the whole one.

The input is then read from the head's positions: no input record below them is read.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from assignors.linear_hashing import lh_bucket_batch, nearest_ancestor_below
from assignors.vectorized import key_hash_batch
from stores.base import Checkpoint
from stores.rocksdb import RocksDBStore
from streamkit.checkpoint_keys import INCARNATION, PROCESSOR_COUNT
from streamkit.kafkaio import ACKED_HOLE_WAIT, KafkaIO
from streamkit.state.changelog import CHANGELOG_POSITION, MARKER_PREFIXES, Marker, named_batch

log = logging.getLogger(__name__)

INCARNATION_KEY = INCARNATION
WINDOW_SUFFIX = 8
"""A windowed table's stored key ends with the 8-byte window start."""


class ChangelogError(Exception):
    """The changelog cannot be read as a chain of markers (one line says where)."""


@dataclass
class RestorePlan:
    """What a restore writes: the state per table and the checkpoint it matches."""

    head: Marker
    position: int
    """The changelog position after the head."""
    state: dict[str, dict[bytes, bytes | None]] = field(default_factory=dict)
    batches: int = 0
    records: int = 0
    skipped: int = 0
    """Records read and not applied (off the chain, or after the head)."""
    counts: set[Any] = field(default_factory=set)
    """The processor counts (``extra[PROCESSOR_COUNT]``, None where absent) of the chain's markers."""

    @property
    def checkpoint(self) -> Checkpoint:
        cp = self.head.checkpoint
        return cp.replace(extra={**cp.extra, CHANGELOG_POSITION: self.position})


def plan_restore(
    records: Sequence[Any], *, topic: str = "", partition: int = 0, incarnation: str = ""
) -> RestorePlan | None:
    """The restore of one processor from its partition's ``records`` (each with
    ``offset``, ``key``, ``value``, ``headers``; in offset order); None if no marker of the job's
    ``incarnation`` was written yet (markers of an earlier one, before a reset, are not
    this job's)."""
    markers: dict[int, Marker] = {}
    malformed: set[int] = set()
    for r in records:
        if r.key is not None and r.key.startswith(MARKER_PREFIXES):
            marker = Marker.of(r, topic, partition)
            if marker is None:
                malformed.add(r.offset)
                continue
            theirs = str(marker.checkpoint.extra.get(INCARNATION_KEY, ""))
            if not (incarnation and theirs and theirs != incarnation):
                markers[r.offset] = marker
    if not markers:
        return None
    top = max(m.generation for m in markers.values())
    head_at = max(o for o, m in markers.items() if m.generation == top)
    chain: list[tuple[int, Marker]] = []
    at: int | None = head_at
    while at is not None:
        link = markers.get(at)
        if link is None and at in malformed:
            raise ChangelogError(
                f"{topic}[{partition}]@{at}: the chain's marker there does not decode (a record streamkit did not "
                "write, or a damaged one), so the markers before it cannot be trusted"
            )
        if link is None:
            raise ChangelogError(f"{topic}[{partition}]: a marker's base {at + 1} names no marker")
        chain.append((at, link))
        if link.base is not None and link.base - 1 >= at:
            raise ChangelogError(f"{topic}[{partition}]: the marker at {at} builds on {link.base}, after it")
        at = None if link.base is None or link.base == 0 else link.base - 1
    chain.reverse()
    plan = RestorePlan(markers[head_at], head_at + 1, batches=len(chain))
    plan.counts = {m.checkpoint.extra.get(PROCESSOR_COUNT) for _, m in chain}
    spans = sorted(span for _, m in chain for span in m.spans or ())
    named = {m.batch.encode() for _, m in chain if m.spans is None}  # batches written before spans
    first = chain[0][1].start if chain[0][1].start >= 0 else chain[0][0]
    # one pass over every change record: at a million keys this loop is the restore's cost
    by_table: dict[bytes, dict[bytes, bytes | None]] = {}
    applied = skipped = 0
    at_span, spans_left = 0, len(spans)
    for r in records:  # (in offset order: the spans are walked along with them)
        key = r.key
        if key is None or key.startswith(MARKER_PREFIXES):
            continue
        offset = r.offset
        while at_span < spans_left and spans[at_span][1] <= offset:
            at_span += 1
        on_chain = at_span < spans_left and spans[at_span][0] <= offset
        if not on_chain and named and first <= offset < head_at:
            on_chain = named_batch(r.headers) in named
        if not on_chain:
            skipped += 1
            continue
        table, _, stored = key.partition(b"\x00")
        state = by_table.get(table)
        if state is None:
            state = by_table[table] = {}
        state[stored] = r.value
        applied += 1
    plan.state = {table.decode(): state for table, state in by_table.items()}
    plan.records, plan.skipped = applied, skipped
    return plan


def keep_own_keys(plan: RestorePlan, pid: int, p0: int, windowed: Iterable[str], count: int | None = None) -> int:
    """Drop from ``plan`` the keys processor ``pid`` does not own at ``count`` processors
    (default: the head's processor count); how many were dropped. A chain written
    wholly for that count holds no other processor's keys (a store that gave keys away
    writes a snapshot next): nothing is dropped then, so a table keyed otherwise than by
    the records' keys (a total under one key) is restored whole."""
    p = head_count(plan, p0) if count is None else count
    if plan.counts == {p} or (p == p0 and plan.counts <= {p, None}):
        return 0
    windowed = set(windowed)
    dropped = 0
    for table, state in plan.state.items():
        if not state:
            continue
        suffix = WINDOW_SUFFIX if table in windowed else 0
        keys = list(state)
        hashes = key_hash_batch([k[:-suffix] for k in keys] if suffix else keys)
        gone = np.flatnonzero(lh_bucket_batch(hashes, p0, p) != pid)
        for i in gone.tolist():
            del state[keys[i]]
        dropped += len(gone)
    return dropped


def head_count(plan: RestorePlan, p0: int) -> int:
    """The processor count the head's store held its keys for."""
    return int(plan.head.checkpoint.extra.get(PROCESSOR_COUNT, p0))


def live_changes(plan: RestorePlan, tables: Iterable[str]) -> dict[str, dict[bytes, bytes | None]]:
    """The plan's state as a store batch of ``tables`` (tombstones dropped: the store is new)."""
    return {name: {k: v for k, v in plan.state.get(name, {}).items() if v is not None} for name in tables}


ReadProgress = Callable[[int, int], None]
"""Called as a changelog partition is read: (offset reached, offset of its end)."""
READ_CHUNK = 100_000
"""Offsets read between two progress reports."""


async def read_partition(io: KafkaIO, topic: str, partition: int, on_read: ReadProgress | None = None) -> list[Any]:
    """Every record of ``topic[partition]`` up to its end as of now, reporting progress.
    What a restore applies lies below a marker, written once every record before it was
    acknowledged: a hole there is compaction's, read past at once."""
    if on_read is None:
        return (await io.read(topic, partition, 0, hole_wait=ACKED_HOLE_WAIT))[0]
    end = (await io.high_watermarks(topic, [partition]))[partition]
    out: list[Any] = []
    pos = 0
    on_read(pos, end)
    while pos < end:
        records, pos = await io.read(topic, partition, pos, min(pos + READ_CHUNK, end), hole_wait=ACKED_HOLE_WAIT)
        out.extend(records)
        on_read(pos, end)
    return out


async def read_plan(
    io: KafkaIO,
    topic: str,
    partition: int,
    *,
    incarnation: str = "",
    log_as: str = "",
    on_read: ReadProgress | None = None,
) -> tuple[RestorePlan | None, int]:
    """The restore plan of ``topic[partition]`` read to its end, and the records read; no
    plan when there is no such partition, no marker of the job's ``incarnation`` in it, or
    the markers do not form a chain (said in one line)."""
    if partition >= ((await io.partition_count(topic)) or 0):  # no changelog yet, or none for this processor
        return None, 0
    records = await read_partition(io, topic, partition, on_read)
    try:  # (in a thread: at a million keys, seconds of work the event loop's heartbeats must not wait for)
        plan = await asyncio.to_thread(plan_restore, records, topic=topic, partition=partition, incarnation=incarnation)
        return plan, len(records)
    except ChangelogError as exc:
        log.warning("%s: %s[%d] not used, the input is read instead: %s", log_as, topic, partition, exc)
        return None, len(records)


@dataclass(frozen=True)
class ChangelogSource:
    """A job's changelog, as restores and seeds read it."""

    io: KafkaIO
    topic: str
    tables: Mapping[str, Any]
    """The app's tables (their names and windows)."""
    p0: int
    """The job's initial processor count (how its keys are placed)."""
    incarnation: str = ""
    """The job's incarnation: markers of an earlier one (before a reset) are not its own."""


async def restore_store(
    source: ChangelogSource,
    pid: int,
    path: Path,
    *,
    log_as: str = "",
    on_read: ReadProgress | None = None,
    configure: Any = None,
) -> RestorePlan | None:
    """Rebuild processor ``pid``'s store at ``path`` (which must not exist) from the
    changelog ``source``; None (nothing written: the caller rebuilds from the input) when the
    changelog has no marker of it, or cannot be read as a chain (said in one line).
    ``on_read``: the progress of the changelog's read (what a restore spends its time on).
    ``configure``: the store's RocksDB options (``RocksDBStore.open``)."""
    t0 = time.monotonic()
    plan, read = await read_plan(
        source.io, source.topic, pid, incarnation=source.incarnation, log_as=log_as, on_read=on_read
    )
    if plan is None:
        return None
    dropped, keys = await asyncio.to_thread(_write_restored, plan, pid, path, source.tables, source.p0, configure)
    took = time.monotonic() - t0
    log.info(
        "%s: processor %d restored from the changelog in %.2f s: %d keys from %d batches (%d records read, "
        "%d off the chain, %d keys of other processors); input from %s",
        log_as, pid, took, keys, plan.batches, read, plan.skipped, dropped,
        {f"{t}[{p}]": o for (t, p), o in sorted(plan.head.checkpoint.positions.items())},
    )  # fmt: skip
    return plan


def _write_restored(
    plan: RestorePlan, pid: int, path: Path, tables: Mapping[str, Any], p0: int, configure: Any
) -> tuple[int, int]:
    """Write the plan's state as processor ``pid``'s store at ``path``, whole or not at all
    (built beside it, then renamed); the keys of other processors dropped, and the keys written."""
    windowed = [name for name, t in tables.items() if getattr(t, "window", None) is not None]
    dropped = keep_own_keys(plan, pid, p0, windowed)
    changes = live_changes(plan, tables)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".restoring")
    if staging.exists():  # a restore killed before its end
        shutil.rmtree(staging)
    with RocksDBStore.open(str(staging), sorted(tables), configure=configure) as store:
        store.commit(changes, plan.checkpoint)
    staging.rename(path)
    return dropped, sum(len(c) for c in changes.values())


async def seed_plan(
    changelog: ChangelogSource, source: int, pid: int, count: int, log_as: str = ""
) -> tuple[RestorePlan | None, str]:
    """Where processor ``pid``, joining as the job grows to ``count`` processors, starts:
    the state of its keys in the changelog of processor ``source`` (the one they split
    from), at the head's input positions (read on from there to the owner's, never below).
    No plan, and why (its bootstrap reads the input history instead), when ``source`` has
    no chain of markers, or its head is of a store that did not hold ``pid``'s keys (one
    written for more processors, before a shrink gave them back)."""
    topic, tables, p0 = changelog.topic, changelog.tables, changelog.p0
    plan, read = await read_plan(changelog.io, topic, source, incarnation=changelog.incarnation, log_as=log_as)
    if plan is None:
        return None, f"processor {source} has no chain of markers in {topic}"
    held = head_count(plan, p0)
    if held >= count or nearest_ancestor_below(pid, p0, held) != source:
        return None, (
            f"processor {source}'s last marker in {topic} is of its store for {held} processors, "
            f"which did not hold processor {pid}'s keys"
        )
    windowed = [name for name, t in tables.items() if getattr(t, "window", None) is not None]
    dropped = keep_own_keys(plan, pid, p0, windowed, count)
    return plan, f"{read} changelog records read, {dropped} keys of other processors left"
