"""The pure parts of processor scaling: the steps of a scale change, which stores a
count change touches, and the staging store's adoption (real RocksDB, no broker)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import streamkit
from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from stores.base import Checkpoint
from stores.rocksdb import RocksDBStore
from streamkit.cli.scale import plan_moves
from streamkit.runtime.jobmeta import Bootstrap, JobLayout
from streamkit.runtime.scaling import adopt_store, key_set_change, open_for_count, staging_path


def test_each_step_of_a_scale_change_bootstraps_one_processor() -> None:
    grow = JobLayout("a", 2, 3, epoch=5, target=5)
    assert grow.bootstrap == Bootstrap(pid=3, count=4, beside=1, staging=False)
    assert grow.hosted == 4 and grow.retiring is None
    nxt = grow.stepped(by="x")
    assert (nxt.p, nxt.epoch, nxt.target) == (4, 6, 5)
    assert nxt.stepped(by="x").target is None  # the last step ends the change
    shrink = JobLayout("a", 2, 4, epoch=7, target=2)
    # processor 3 retires: its keys go back to processor 1, rebuilt for 3 into a staging store
    assert shrink.retiring == 3 and shrink.bootstrap == Bootstrap(pid=1, count=3, beside=1, staging=True)
    assert shrink.hosted == 4 and shrink.joining is None
    assert shrink.stepped(by="x").bootstrap == Bootstrap(pid=0, count=2, beside=0, staging=True)
    assert JobLayout("a", 2, 2).bootstrap is None


@pytest.mark.parametrize(("stored", "count", "change"), [(2, 3, "shrank"), (3, 2, "grew"), (3, 4, None), (4, 3, None)])
def test_a_count_change_touches_only_the_stores_whose_keys_change(stored: int, count: int, change: str | None) -> None:
    # processor 0 splits at 2 -> 3 and receives back at 3 -> 2; 3 -> 4 splits processor 1 only
    assert key_set_change(0, 2, stored, count) == change
    assert key_set_change(0, 2, None, count) is None


def test_the_plan_of_a_shrink_names_the_retiring_processors_in_order() -> None:
    moves = plan_moves(2, 4, 2, {"t": (2, 4)})
    assert [m.describe() for m in moves] == [
        "processor 3: retires, its keys go back to processor 1 in partitions t [3] (about 25.0% of all keys)",
        "processor 2: retires, its keys go back to processor 0 in partitions t [2] (about 25.0% of all keys)",
    ]
    assert [m.moved for m in plan_moves(2, 2, 4, {"t": (2, 4)})] == [2, 3]


def _write(path: Path, keys: list[bytes], p: int) -> None:
    with RocksDBStore.open(str(path), ["seen"]) as store:
        store.commit({"seen": dict.fromkeys(keys, b"1")}, Checkpoint(positions={("t", 0): 10}, extra={"p": p}))


def _keys(path: Path) -> set[bytes]:
    with RocksDBStore.open(str(path), ["seen"]) as store:
        return {k for k, _ in store.items("seen")}


def test_a_receiving_store_is_replaced_by_its_staging_store_or_emptied(tmp_path: Path) -> None:
    live = tmp_path / "processor-0"
    _write(live, [b"a"], p=3)
    assert adopt_store(live, 2) == "emptied, to be rebuilt" and not live.exists()
    _write(live, [b"a"], p=3)
    _write(staging_path(live), [b"a", b"b"], p=3)  # built for another count: not used
    assert adopt_store(live, 2) == "emptied, to be rebuilt"
    _write(live, [b"a"], p=3)
    _write(staging_path(live), [b"a", b"b"], p=2)
    assert adopt_store(live, 2) == "replaced by its staging store"
    assert _keys(live) == {b"a", b"b"} and not staging_path(live).exists()


def test_opening_for_more_processors_purges_the_keys_that_moved(tmp_path: Path) -> None:
    keys = [f"k{i}".encode() for i in range(100)]
    path = tmp_path / "processor-0"
    _write(path, [k for k in keys if lh_bucket(key_hash(k), 2, 2) == 0], p=2)
    app = streamkit.App("steps")
    app.table("seen")
    tables = app.tables

    async def reopen(count: int) -> set[bytes]:
        proc = await open_for_count(0, path, tables, 2, count, timeout=1.0, log_as="test", adopt=True)
        proc.close()
        return _keys(path)

    kept = asyncio.run(reopen(3))
    assert kept and kept == {k for k in keys if lh_bucket(key_hash(k), 2, 3) == 0}
    assert asyncio.run(reopen(3)) == kept  # the same count again: nothing changes
    assert asyncio.run(reopen(2)) == set()  # keys came back, no staging store: rebuilt from the history
