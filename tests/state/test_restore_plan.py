"""Which changelog records a restore applies (pure: records built by hand, as the writer
lays them out; the proof with real processes, a real broker and kills is in
tests/state/test_changelog_restore.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from stores.base import Checkpoint
from streamkit.state.changelog import (
    BATCH_HEADER,
    CHANGELOG_POSITION,
    HEADED_MARKER_PREFIX,
    MARKER_PREFIX,
    MARKER_PREFIXES,
    Marker,
    change_key,
)
from streamkit.state.restore import ChangelogError, ChangelogSource, keep_own_keys, plan_restore, seed_plan


@dataclass
class Rec:
    offset: int
    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


class Partition:
    """A changelog partition written as ``ChangelogWriter.write`` does (``legacy``: as it
    did before markers held their spans: each record naming its batch in a header)."""

    def __init__(self, *, legacy: bool = False) -> None:
        self.records: list[Any] = []
        self.legacy = legacy

    def records_of(self, name: str, changes: dict[bytes, bytes | None]) -> tuple[int, int]:
        """One producer record batch of ``changes``: its span."""
        start = len(self.records)
        headers = [(BATCH_HEADER, name.encode())] if self.legacy else []
        for k, v in changes.items():
            self.records.append(Rec(len(self.records), change_key("t", k), v, list(headers)))
        return start, len(self.records)

    def marker(
        self, name: str, spans: list[tuple[int, int]], *, base: int | None, gen: int, at: int, p: int = 2
    ) -> int:
        """The marker closing the batch written at ``spans``; the position after it."""
        spans = [(a, b) for a, b in spans if b > a]
        cp = Checkpoint(positions={("in", 0): at}, generation=gen, extra={"p": p})
        marker = Marker(name, base, gen, cp, spans[0][0] if spans else -1, None if self.legacy else tuple(spans))
        prefix = HEADED_MARKER_PREFIX if self.legacy else MARKER_PREFIX
        self.records.append(Rec(len(self.records), prefix + name.encode(), marker.encode()))
        return len(self.records)

    def batch(
        self, name: str, changes: dict[bytes, bytes | None], *, base: int | None, gen: int, at: int, p: int = 2
    ) -> int:
        span = self.records_of(name, changes)
        return self.marker(name, [span], base=base, gen=gen, at=at, p=p)

    def orphan(self, name: str, changes: dict[bytes, bytes | None]) -> None:
        """Records of a batch whose writer died before its marker."""
        self.records_of(name, changes)


def test_the_chain_applies_every_batch_in_order_and_the_head_gives_positions() -> None:
    log = Partition()
    p1 = log.batch("a", {b"k1": b"1", b"k2": b"1"}, base=None, gen=1, at=10)
    p2 = log.batch("b", {b"k1": b"2", b"k2": None}, base=p1, gen=1, at=20)
    plan = plan_restore(log.records)
    assert plan is not None
    assert plan.state == {"t": {b"k1": b"2", b"k2": None}}
    assert plan.checkpoint.positions == {("in", 0): 20}
    assert plan.checkpoint.extra[CHANGELOG_POSITION] == p2 and plan.batches == 2


def test_an_unclosed_batch_and_a_batch_the_store_never_committed_are_not_applied() -> None:
    log = Partition()
    p1 = log.batch("a", {b"k1": b"1"}, base=None, gen=1, at=10)
    log.batch("lost", {b"k1": b"99", b"k3": b"99"}, base=p1, gen=1, at=30)  # marker written, store batch not
    p3 = log.batch("b", {b"k1": b"2"}, base=p1, gen=1, at=20)  # the restarted store builds on p1
    log.orphan("dying", {b"k1": b"77"})  # killed before its marker
    plan = plan_restore(log.records)
    assert plan is not None
    assert plan.state == {"t": {b"k1": b"2"}} and plan.skipped == 3
    assert plan.checkpoint.positions == {("in", 0): 20} and plan.position == p3


@pytest.mark.parametrize("legacy", [False, True], ids=["spans", "headers"])
def test_a_zombies_records_between_the_owners_record_batches_are_not_the_owners(legacy: bool) -> None:
    """A zombie (an old owner paused through a rebalance) writes while the new owner's
    batch goes out in several producer batches: the marker names its own records only."""
    log = Partition(legacy=legacy)
    p1 = log.batch("a", {b"k1": b"1", b"k2": b"1"}, base=None, gen=1, at=10)
    p2 = log.batch("takeover", {}, base=p1, gen=2, at=10)
    first = log.records_of("new", {b"k1": b"2"})
    zombie = log.records_of("zombie", {b"k2": b"666", b"k3": b"666"})
    second = log.records_of("new", {b"k4": b"2"})
    log.marker("zombie", [zombie], base=p1, gen=1, at=15)
    p3 = log.marker("new", [first, second], base=p2, gen=2, at=20)
    plan = plan_restore(log.records)
    assert plan is not None and plan.position == p3
    assert plan.state == {"t": {b"k1": b"2", b"k2": b"1", b"k4": b"2"}} and plan.skipped == 2


def test_a_changelog_written_before_spans_goes_on_with_spans() -> None:
    """A job's changelog from before markers held spans (records name their batch), then
    written on by this version: one chain, both read."""
    log = Partition(legacy=True)
    p1 = log.batch("a", {b"k1": b"1", b"k2": b"1"}, base=None, gen=1, at=10)
    log.orphan("dying", {b"k2": b"77"})
    log.legacy = False
    log.orphan("dying-too", {b"k1": b"78"})
    p2 = log.batch("b", {b"k2": b"2"}, base=p1, gen=2, at=20)
    plan = plan_restore(log.records)
    assert plan is not None and plan.position == p2 and plan.batches == 2
    assert plan.state == {"t": {b"k1": b"1", b"k2": b"2"}} and plan.skipped == 2


def test_a_zombies_later_markers_of_an_older_generation_lose_to_the_takeover() -> None:
    log = Partition()
    p1 = log.batch("a", {b"k1": b"1"}, base=None, gen=1, at=10)
    log.batch("takeover", {}, base=p1, gen=2, at=10)  # the new owner took the processor
    log.batch("zombie", {b"k1": b"666"}, base=p1, gen=1, at=15)  # the old owner resumed
    plan = plan_restore(log.records)
    assert plan is not None
    assert plan.state == {"t": {b"k1": b"1"}} and plan.checkpoint.generation == 2


def test_a_snapshot_starts_the_chain_afresh() -> None:
    log = Partition()
    p1 = log.batch("old", {b"gone": b"1"}, base=None, gen=1, at=5)
    log.batch("b", {b"gone": b"2"}, base=p1, gen=1, at=6)
    log.batch("snap", {b"k1": b"5"}, base=None, gen=3, at=50)  # a store written past the changelog
    plan = plan_restore(log.records)
    assert plan is not None
    assert plan.state == {"t": {b"k1": b"5"}} and plan.batches == 1


def test_nothing_to_restore_before_the_first_marker() -> None:
    log = Partition()
    log.orphan("dying", {b"k1": b"1"})
    assert plan_restore(log.records) is None


def test_markers_of_an_earlier_incarnation_are_not_the_jobs() -> None:
    """After `streamkit reset --cluster` the job starts over under a new incarnation: the
    old job's markers, still in the topic, restore nothing."""
    log = Partition()
    log.batch("old", {b"k1": b"1"}, base=None, gen=1, at=10)
    for r in log.records:
        if r.key.startswith(MARKER_PREFIXES):
            m = Marker.decode(r.value)
            stamped = m.checkpoint.replace(extra={"incarnation": "a"})
            r.value = Marker(m.batch, m.base, m.generation, stamped, m.start, m.spans).encode()
    assert plan_restore(log.records, incarnation="b") is None
    assert plan_restore(log.records, incarnation="a") is not None


def test_a_base_that_does_not_lie_before_its_marker_is_refused() -> None:
    log = Partition()
    log.batch("a", {b"k1": b"1"}, base=5, gen=1, at=10)  # a topic deleted and made again
    with pytest.raises(ChangelogError):
        plan_restore(log.records)


def test_a_chain_written_for_one_count_is_restored_whole_and_one_spanning_a_growth_keeps_its_keys() -> None:
    keys = {f"k{i}".encode(): b"1" for i in range(500)}
    uniform = Partition()
    uniform.batch("a", keys, base=None, gen=1, at=10, p=2)
    plan = plan_restore(uniform.records)
    assert plan is not None
    # every key kept: the store wrote a snapshot when it last gave keys away
    assert keep_own_keys(plan, 0, 2, [], None) == 0 and len(plan.state["t"]) == 500
    # the same records as the changelog of processor 0 that a processor joining at 3 starts from
    dropped = keep_own_keys(plan, 2, 2, [], 3)
    own = {k for k in keys if lh_bucket(key_hash(k), 2, 3) == 2}
    assert set(plan.state["t"]) == own and dropped == 500 - len(own) and 0 < len(own) < 500
    # a chain that spans a growth (3 -> 4, no snapshot between) holds keys processor 1 gave away
    spanning = Partition()
    at = spanning.batch("a", keys, base=None, gen=1, at=10, p=3)
    spanning.batch("b", {b"k1": b"2"}, base=at, gen=2, at=20, p=4)
    plan = plan_restore(spanning.records)
    assert plan is not None and plan.counts == {3, 4}
    keep_own_keys(plan, 1, 2, [], None)
    assert set(plan.state["t"]) == {k for k in keys if lh_bucket(key_hash(k), 2, 4) == 1}


class _OnePartition:
    """The two reads ``seed_plan`` makes, of a changelog whose partition 0 is ``log``."""

    def __init__(self, log: Partition) -> None:
        self.log = log

    async def partition_count(self, topic: str) -> int:
        return 4

    async def read(self, topic: str, partition: int, offset: int, **_: Any) -> tuple[list[Any], int]:
        return (self.log.records, len(self.log.records)) if partition == 0 else ([], 0)


def test_a_joining_processor_starts_only_from_a_store_that_held_its_keys() -> None:
    keys = {f"k{i}".encode(): b"1" for i in range(200)}
    tables = {"t": None}
    log = Partition()
    log.batch("a", keys, base=None, gen=1, at=10, p=2)
    io = _OnePartition(log)
    # 2 -> 3: processor 2's keys split from processor 0's store of 2 processors
    plan, why = asyncio.run(seed_plan(ChangelogSource(io, "cl", tables, 2), 0, 2, 3))  # type: ignore[arg-type]
    assert plan is not None, why
    assert set(plan.state["t"]) == {k for k in keys if lh_bucket(key_hash(k), 2, 3) == 2}
    assert plan.checkpoint.positions == {("in", 0): 10}
    # processor 3 (joining at 4) comes from processor 1, not 0
    plan, why = asyncio.run(seed_plan(ChangelogSource(io, "cl", tables, 2), 0, 3, 4))  # type: ignore[arg-type]
    assert plan is None and "did not hold processor 3's keys" in why
    # a head written for more processors than the job has now (before a shrink gave keys back)
    log.batch("b", {}, base=len(log.records), gen=2, at=20, p=4)
    plan, why = asyncio.run(seed_plan(ChangelogSource(io, "cl", tables, 2), 0, 2, 3))  # type: ignore[arg-type]
    assert plan is None and "for 4 processors" in why
    # nothing in the changelog: the input history
    plan, why = asyncio.run(seed_plan(ChangelogSource(io, "cl", tables, 2), 1, 3, 4))  # type: ignore[arg-type]
    assert plan is None and "no chain of markers" in why


@pytest.mark.parametrize("garbage", [b"\x00\xffnot json", b"[1]", b'{"batch": 1}', b"", None])
def test_a_record_under_a_marker_key_that_is_no_marker_is_skipped_and_a_chain_through_one_is_refused(
    garbage: bytes | None,
) -> None:
    """A plain producer's record under a marker key is skipped (counted, said with
    topic[partition]@offset) and the chain is what the well-formed markers say; a chain
    whose base is such a record is refused with where it broke (the restore then reads the
    input instead: ``read_plan``)."""
    log = Partition()
    p1 = log.batch("a", {b"k1": b"1"}, base=None, gen=1, at=10)
    log.records.append(Rec(len(log.records), MARKER_PREFIX + b"forged", garbage))
    p2 = log.batch("b", {b"k1": b"2"}, base=p1, gen=1, at=20)
    log.records.append(Rec(len(log.records), MARKER_PREFIX + b"forged-after", garbage))
    plan = plan_restore(log.records, topic="app-changelog", partition=0)
    assert plan is not None and plan.state == {"t": {b"k1": b"2"}} and plan.position == p2

    broken = Partition()
    broken.records_of("a", {b"k1": b"1"})
    at = len(broken.records)
    broken.records.append(Rec(at, MARKER_PREFIX + b"a", garbage))  # where the chain's first marker was
    broken.batch("b", {b"k1": b"2"}, base=at + 1, gen=1, at=20)
    with pytest.raises(ChangelogError, match=rf"app-changelog\[0\]@{at}: the chain's marker there does not decode"):
        plan_restore(broken.records, topic="app-changelog", partition=0)
