"""A standby copy tailing a changelog partition ends where a restore of the whole
partition would: the same state, the same checkpoint. Over seeded random histories of
what writers do (batches on the chain, batches a crash left without a marker or without
a store batch, takeovers, a zombie's markers, snapshots), applied to a real RocksDB
store in chunks of random sizes; where the lineage breaks, the copy is restored from the
records read so far, as the keeper does. (The proof with real workers is in
tests/state/test_standbys.py.)"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from stores.rocksdb import RocksDBStore
from streamkit.state.changelog import MARKER_PREFIXES
from streamkit.state.restore import live_changes, plan_restore
from streamkit.state.standby import LineageBroken, StandbyCopy
from tests.state.test_restore_plan import Partition

SEEDS = range(40)


def _history(rng: random.Random, steps: int) -> Partition:
    log = Partition(legacy=rng.random() < 0.25)  # some as changelogs written before spans
    data: dict[bytes, bytes] = {}
    pos = log.batch("b0", {b"k0": b"0"}, base=None, gen=1, at=0)
    data[b"k0"] = b"0"
    gen, at, old = 1, 0, [(pos, 1)]
    for i in range(1, steps):
        kind = rng.choices(["batch", "orphan", "lost", "takeover", "zombie", "snapshot"], [10, 2, 1, 1, 1, 1])[0]
        changes: dict[bytes, bytes | None] = {
            f"k{rng.randrange(12)}".encode(): (None if rng.random() < 0.2 else str(i).encode())
            for _ in range(rng.randrange(0, 5))
        }
        at += 1
        if kind == "batch":
            pos = log.batch(f"b{i}", changes, base=pos, gen=gen, at=at)
            for k, v in changes.items():
                if v is None:
                    data.pop(k, None)
                else:
                    data[k] = v
            old.append((pos, gen))
        elif kind == "orphan":
            log.orphan(f"o{i}", changes)
        elif kind == "lost":  # marker written, store batch not: the owner builds on pos again
            log.batch(f"l{i}", changes, base=pos, gen=gen, at=at)
        elif kind == "takeover":
            gen += 1
            pos = log.batch(f"t{i}", {}, base=pos, gen=gen, at=at - 1)
            old.append((pos, gen))
        elif kind == "zombie" and gen > 1:
            base, zgen = rng.choice([(p, g) for p, g in old if g < gen] or [(None, 0)])
            if base is not None:
                log.batch(f"z{i}", changes, base=base, gen=zgen, at=at)
        elif kind == "snapshot":
            gen += 1
            data = {k: v for k, v in data.items() if rng.random() < 0.7}
            pos = log.batch(f"s{i}", dict(data), base=None, gen=gen, at=at)
            old.append((pos, gen))
    return log


def _copy_from(records: list[Any], path: Path) -> StandbyCopy:
    """A copy restored from ``records`` (what the keeper does first, and at a break)."""
    plan = plan_restore(records)
    assert plan is not None
    shutil.rmtree(path, ignore_errors=True)
    with RocksDBStore.open(str(path), ["t"]) as store:
        store.commit(live_changes(plan, ["t"]), plan.checkpoint)
    return StandbyCopy.open(0, path, ["t"])


@pytest.mark.parametrize("seed", SEEDS)
def test_a_tailing_copy_ends_as_a_restore_of_the_whole_partition(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    log = _history(rng, rng.randrange(5, 60))
    records = log.records
    path = tmp_path / "processor-0"
    first = next(r.offset for r in records if r.key.startswith(MARKER_PREFIXES)) + 1
    copy = _copy_from(records[: rng.randrange(first, len(records) + 1)], path)
    breaks = 0
    while copy.read_to < len(records):
        end = min(len(records), copy.read_to + rng.randrange(1, 8))
        try:
            copy.apply(records[copy.position : end])  # the keeper reads from the position on
            # at every step, exactly what a restore of the partition up to its last marker holds
            now = plan_restore(records[: copy.position])
            assert now is not None and now.position == copy.position, f"seed {seed}: at {copy.position}"
            assert dict(copy.store.items("t")) == live_changes(now, ["t"])["t"], f"seed {seed}: at {copy.position}"
        except LineageBroken:
            breaks += 1
            assert breaks < 30, f"seed {seed}: the copy keeps breaking at {copy.position}"
            copy.close()
            copy = _copy_from(records[:end], path)
    want = plan_restore(records)
    assert want is not None
    got = dict(copy.store.items("t"))
    assert got == live_changes(want, ["t"])["t"], f"seed {seed}: {breaks} breaks"
    assert copy.checkpoint == want.checkpoint
    assert copy.position == want.position
    copy.close()


def test_a_copy_applies_only_what_a_marker_closed_and_ignores_a_zombie(tmp_path: Path) -> None:
    log = Partition()
    p1 = log.batch("a", {b"k1": b"1"}, base=None, gen=1, at=10)
    copy = _copy_from(log.records, tmp_path / "processor-0")
    log.orphan("open", {b"k1": b"2"})
    assert copy.apply(log.records[copy.position :]) == 0 and dict(copy.store.items("t")) == {b"k1": b"1"}
    p2 = log.batch("b", {b"k2": b"2"}, base=p1, gen=2, at=20)
    assert copy.apply(log.records[copy.read_to :]) == 1
    log.batch("zombie", {b"k1": b"666"}, base=p1, gen=1, at=15)
    assert copy.apply(log.records[copy.read_to :]) == 0
    assert dict(copy.store.items("t")) == {b"k1": b"1", b"k2": b"2"}
    assert copy.position == p2 and copy.checkpoint.positions == {("in", 0): 20}
    copy.close()


@pytest.mark.parametrize("legacy", [False, True], ids=["spans", "headers"])
def test_a_copy_leaves_out_a_zombies_records_between_the_owners_record_batches(legacy: bool, tmp_path: Path) -> None:
    log = Partition(legacy=legacy)
    p1 = log.batch("a", {b"k1": b"1", b"k2": b"1"}, base=None, gen=1, at=10)
    p2 = log.batch("takeover", {}, base=p1, gen=2, at=10)
    copy = _copy_from(log.records, tmp_path / "processor-0")
    first = log.records_of("new", {b"k1": b"2"})
    zombie = log.records_of("zombie", {b"k2": b"666"})
    second = log.records_of("new", {b"k3": b"2"})
    log.marker("zombie", [zombie], base=p1, gen=1, at=15)
    p3 = log.marker("new", [first, second], base=p2, gen=2, at=20)
    assert copy.apply(log.records[copy.read_to :]) == 1
    assert dict(copy.store.items("t")) == {b"k1": b"2", b"k2": b"1", b"k3": b"2"} and copy.position == p3
    copy.close()


def test_a_marker_building_on_another_position_breaks_the_lineage(tmp_path: Path) -> None:
    log = Partition()
    p1 = log.batch("a", {b"k1": b"1"}, base=None, gen=1, at=10)
    log.batch("b", {b"k1": b"2"}, base=p1, gen=1, at=20)  # its store batch lost to a crash
    copy = _copy_from(log.records, tmp_path / "processor-0")
    log.batch("c", {b"k1": b"3"}, base=p1, gen=1, at=20)  # the restarted owner builds on p1
    with pytest.raises(LineageBroken, match="builds on changelog position"):
        copy.apply(log.records[copy.read_to :])
    copy.close()
