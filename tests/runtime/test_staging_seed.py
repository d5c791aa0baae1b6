"""The pure parts of seeding a shrink's staging store from two changelogs: the common
positions both key sets are brought to, and the merge of their states (real RocksDB
stores). The proof with real workers, a real broker and a shrink under load is
tests/runtime/test_scaling.py (grow and shrink)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import streamkit
from stores.base import Checkpoint
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.scale.staging_seed import aligned_positions, holds_keys, merge_states
from streamkit.state.changelog import Marker
from streamkit.state.restore import RestorePlan
from streamkit.tables import Table


def _plan(positions: dict[tuple[str, int], int], ranges: dict[tuple[str, int], list[tuple[int, int]]]) -> RestorePlan:
    head = Checkpoint(positions=positions, ic_ranges=ranges, generation=1)
    return RestorePlan(head=Marker(batch="b", base=None, generation=1, checkpoint=head, start=0), position=1)


def test_common_positions_are_the_furthest_of_either_head_ic_ranges_included() -> None:
    receiving = _plan({("in", 0): 10, ("in", 1): 5}, {("in", 0): [(12, 14)]})
    retiring = _plan({("in", 0): 7, ("in", 1): 9, ("in", 2): 3}, {})
    assert aligned_positions([receiving, retiring]) == {("in", 0): 15, ("in", 1): 9, ("in", 2): 3}


def _store(tmp: Path, pid: int, tables: dict[str, Table], values: dict[bytes, bytes]) -> ProcessorState:
    proc = asyncio.run(ProcessorState.open(pid, tmp / f"p{pid}", tables, 1.0))
    proc.store.commit({"counts": values}, Checkpoint(positions={("in", 0): 1}))
    proc.reload()
    return proc


def test_disjoint_states_merge_and_a_key_held_by_both_is_refused(tmp_path: Path) -> None:
    app = streamkit.App("staging-seed-test")
    tables: dict[str, Table] = {"counts": app.table("counts", default=int)}
    a = _store(tmp_path, 0, tables, {b"k1": b"1", b"k2": b"2"})
    b = _store(tmp_path, 2, tables, {b"k3": b"3"})
    c = _store(tmp_path, 4, tables, {b"k2": b"9"})
    try:
        assert merge_states([a, b]) == {"counts": {b"k1": b"1", b"k2": b"2", b"k3": b"3"}}
        why = merge_states([a, c])
        assert isinstance(why, str) and "'counts'" in why and "k2" in why
    finally:
        for proc in (a, b, c):
            proc.close()


def test_a_changelog_head_serves_only_if_its_store_held_every_key_of_the_processor() -> None:
    # p0 = 3: processor 3 splits from 0 at 3 -> 4, processor 4 from 1 at 4 -> 5
    assert holds_keys(0, 3, held=5, count=4)  # 0's keys are the same for 4 and 5 processors
    assert holds_keys(0, 3, held=3, count=4)  # a superset (3's keys too): the merge keeps 0's
    assert holds_keys(3, 3, held=4, count=4)
    assert not holds_keys(1, 3, held=5, count=4)  # 4's keys had moved away from 1
    assert not holds_keys(4, 3, held=4, count=5)  # 4 did not exist for 4 processors
