"""Staging and atomic publication of backfilled stores, without Spark."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stores.base import Checkpoint, StoreLockedError
from stores.rocksdb import RocksDBStore, write_sst
from streamkit.spark.staging import (
    BACKFILL_DIR,
    MARKER_FILE,
    BackfillBusy,
    BackfillRefused,
    InjectedFailure,
    Staging,
    _SimulatedCrash,
    live_store_dirs,
    lock_store,
    recover,
)

TABLES = ["t"]


def make_live(app_dir: Path, proc: int, items: dict[bytes, bytes], pos: int) -> None:
    store = RocksDBStore.open(str(app_dir / f"processor-{proc}"), TABLES)
    store.commit({"t": items}, Checkpoint(positions={("in", proc): pos}))
    store.close()


def snapshot(app_dir: Path) -> dict[int, tuple[dict[bytes, bytes], Checkpoint]]:
    out = {}
    for proc, path in live_store_dirs(app_dir).items():
        store = RocksDBStore.open(str(path), TABLES, create=False)
        try:
            out[proc] = (dict(store.items("t")), store.checkpoint())
        finally:
            store.close()
    return out


def stage(staging: Staging, count: int, tag: bytes) -> None:
    staging.prepare_sst_dirs(range(count), TABLES)
    for proc in range(count):
        sst = staging.sst_dir(proc, "t") / "sub-0.sst"
        write_sst(sst, [(b"k%d" % proc, tag)])
        staging.build_store(proc, TABLES, {"t": [str(sst)]}, Checkpoint(positions={("in", proc): 100}))


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    d = tmp_path / "app"
    d.mkdir()
    for proc in range(3):
        make_live(d, proc, {b"old%d" % proc: b"v"}, pos=7)
    return d


def test_publish_replaces_every_store_and_removes_extra_processors(app_dir: Path) -> None:
    with Staging(app_dir) as staging:
        stage(staging, 2, b"new")
        published = staging.publish(2)
    assert [p.name for p in published] == ["processor-0", "processor-1"]
    snap = snapshot(app_dir)
    assert sorted(snap) == [0, 1]  # processor-2 (beyond the new count) is gone
    assert snap[0] == ({b"k0": b"new"}, Checkpoint(positions={("in", 0): 100}))
    assert (app_dir / "processor-0" / MARKER_FILE).exists()
    # the staging area is gone, only the lock file remains
    assert sorted(os.listdir(app_dir / BACKFILL_DIR)) == ["lock"]


def test_publish_creates_stores_where_none_existed(tmp_path: Path) -> None:
    app_dir = tmp_path / "fresh"
    with Staging(app_dir) as staging:
        stage(staging, 3, b"x")
        staging.publish(3)
    assert sorted(snapshot(app_dir)) == [0, 1, 2]


def test_a_store_held_by_a_running_processor_is_refused(app_dir: Path) -> None:
    before = snapshot(app_dir)
    held = RocksDBStore.open(str(app_dir / "processor-1"), TABLES)
    try:
        with Staging(app_dir) as staging:
            with pytest.raises(BackfillRefused, match=rf"processor-1.*pid {os.getpid()}"):
                staging.check_live_unlocked(range(3))
            stage(staging, 3, b"new")
            with pytest.raises(BackfillRefused, match="unchanged"):
                staging.publish(3)
    finally:
        held.close()
    assert snapshot(app_dir) == before


@pytest.mark.parametrize("point", ["publish", "before-commit"])
def test_a_failure_during_publish_rolls_everything_back(app_dir: Path, point: str) -> None:
    before = snapshot(app_dir)
    with pytest.raises(InjectedFailure):
        with Staging(app_dir, fail_at=point) as staging:
            stage(staging, 2, b"new")
            staging.publish(2)
    assert snapshot(app_dir) == before
    assert sorted(os.listdir(app_dir / BACKFILL_DIR)) == ["lock"]


def test_a_crash_during_publish_is_rolled_back_by_recover(app_dir: Path) -> None:
    before = snapshot(app_dir)
    with pytest.raises(_SimulatedCrash):
        with Staging(app_dir, fail_at="publish-crash") as staging:
            stage(staging, 2, b"new")
            staging.publish(2)
    # the "dead" process left a half-done publish: processor-0 swapped, journal present
    assert (app_dir / BACKFILL_DIR / "journal.json").exists()
    assert (app_dir / "processor-0" / MARKER_FILE).exists()
    assert recover(app_dir) is True
    assert snapshot(app_dir) == before
    assert recover(app_dir) is False
    # the next backfill cleans the stale run and works
    with Staging(app_dir) as staging:
        stage(staging, 3, b"again")
        staging.publish(3)
    assert snapshot(app_dir)[2][0] == {b"k2": b"again"}


def test_one_backfill_per_app_at_a_time(app_dir: Path) -> None:
    with Staging(app_dir):
        with pytest.raises(BackfillBusy, match=f"pid {os.getpid()}"):
            with Staging(app_dir):
                pass


def test_lock_store_conflicts_with_an_open_store(app_dir: Path) -> None:
    held = RocksDBStore.open(str(app_dir / "processor-0"), TABLES)
    try:
        with pytest.raises(StoreLockedError):
            lock_store(app_dir / "processor-0")
    finally:
        held.close()
    lock = lock_store(app_dir / "processor-0")
    try:
        with pytest.raises(StoreLockedError):
            RocksDBStore.open(str(app_dir / "processor-0"), TABLES)
    finally:
        lock.release()


def test_keep_backup_keeps_the_replaced_stores(app_dir: Path) -> None:
    before = snapshot(app_dir)
    with Staging(app_dir, keep_backup=True) as staging:
        stage(staging, 3, b"new")
        staging.publish(3)
        run = staging.run_id
    backup = app_dir / BACKFILL_DIR / f"backup-{run}"
    assert sorted(p.name for p in backup.iterdir()) == ["processor-0", "processor-1", "processor-2"]
    kept = snapshot(backup)
    assert kept == before
