"""Standby placement and the failover preference (pure): over seeded random groups of
members on disks, with copies reported, every rule holds."""

from __future__ import annotations

import random

import pytest

from assignors.placement import assign_processors_to_members
from assignors.standbys import place_actives, place_standbys


def _group(rng: random.Random) -> tuple[dict[str, str], int, int]:
    disks = rng.randrange(1, 5)
    members = {f"m{i}": f"disk{rng.randrange(disks)}" for i in range(rng.randrange(1, 7))}
    return members, rng.randrange(1, 13), rng.randrange(0, 3)


@pytest.mark.parametrize("seed", range(200))
def test_standbys_sit_on_other_disks_than_their_active_and_each_other_balanced(seed: int) -> None:
    rng = random.Random(seed)
    disks, p, replicas = _group(rng)
    copies = {m: {q: rng.randrange(100) for q in range(p) if rng.random() < 0.3} for m in disks}
    hosting = assign_processors_to_members({m: [] for m in disks}, p)
    standbys = place_standbys(hosting, disks, copies, replicas, p)
    on = {pid: disks[m] for m, ids in hosting.items() for pid in ids}
    n_disks = len(set(disks.values()))
    per_disk: dict[str, int] = {}
    for pid in range(p):
        where = [disks[m] for m, ids in standbys.items() if pid in ids]
        assert on[pid] not in where, f"processor {pid}: a standby on its active's disk"
        assert len(where) == len(set(where)), f"processor {pid}: two copies on one disk"
        assert len(where) == min(replicas, n_disks - 1), f"processor {pid}: {len(where)} standbys"
        for d in where:
            per_disk[d] = per_disk.get(d, 0) + 1
    if per_disk and replicas:
        share = -(-p * replicas // n_disks)
        assert max(per_disk.values()) <= share + replicas, per_disk  # a disk keeps about its share


def test_a_disk_holding_a_copy_keeps_it_and_the_furthest_copy_wins() -> None:
    disks = {"a": "d1", "b": "d2", "c": "d3"}
    hosting = {"a": [0], "b": [1], "c": [2]}
    copies = {"b": {0: 50}, "c": {0: 90, 1: 10}}
    standbys = place_standbys(hosting, disks, copies, 1, 3)
    assert 0 in standbys["c"]  # the furthest of the two copies of 0
    assert 1 in standbys["c"] or 1 in standbys["a"]
    assert 2 not in standbys["c"]  # its active's disk


def test_a_dead_hosts_processors_go_to_warm_copies_and_the_balanced_target_warms_up() -> None:
    disks = {"b": "d2", "c": "d3"}
    hosted = {"b": [0, 2, 3], "c": []}  # c is a new worker; the one that hosted 1, 4 and 5 died
    copies = {"b": {0: 90_000, 2: 90_000, 3: 90_000, 1: 70_000, 4: 70_000, 5: 70_000}, "c": {1: 69_000, 5: 100}}
    actives, warmups = place_actives(hosted, disks, copies, 6)
    # balance wants 1, 4, 5 on c: its copy of 1 is within the acceptable lag, 4 and 5 are not
    # (a small changelog is restored in no time: no copy at all is within the lag of one under 10,000)
    assert actives == {"b": [0, 2, 3, 4, 5], "c": [1]}
    assert warmups == {"b": [], "c": [4, 5]}
    # once c's copies caught up, the balanced assignment is taken
    actives, warmups = place_actives(actives, disks, {**copies, "c": {1: 70_000, 4: 69_999, 5: 70_000}}, 6)
    assert sorted(actives["c"]) == [1, 4, 5] and warmups == {"b": [], "c": []}


@pytest.mark.parametrize("seed", range(100))
def test_every_processor_is_placed_once_and_a_warmup_never_sits_with_its_active(seed: int) -> None:
    rng = random.Random(seed)
    disks, p, _ = _group(rng)
    hosted = {m: [] for m in disks}
    for pid in range(p):
        if rng.random() < 0.6:
            hosted[rng.choice(sorted(disks))].append(pid)
    copies = {m: {q: rng.randrange(0, 30_000) for q in range(p) if rng.random() < 0.4} for m in disks}
    actives, warmups = place_actives(hosted, disks, copies, p)
    placed = sorted(pid for ids in actives.values() for pid in ids)
    assert placed == list(range(p))
    on = {pid: disks[m] for m, ids in actives.items() for pid in ids}
    for m, ids in warmups.items():
        assert all(on[pid] != disks[m] for pid in ids), "a warm-up on its active's disk"
    if not any(copies.values()):
        assert actives == assign_processors_to_members(hosted, p)


def test_without_a_second_disk_there_is_no_standby() -> None:
    disks = {"a": "d1", "b": "d1"}
    hosting = assign_processors_to_members({"a": [], "b": []}, 4)
    assert place_standbys(hosting, disks, {}, 1, 4) == {"a": [], "b": []}


def test_what_members_say_and_get_round_trips() -> None:
    from assignors.group import MemberInfo, ProcessorAssignment

    info = MemberInfo(2, 3, [1], standby_replicas=1, acceptable_lag=500, disk="h:/d", copies={0: 12, 2: 7})
    assert MemberInfo.decode(info.encode()) == info
    given = ProcessorAssignment(4, 2, 3, {1: [("t", 1, None)]}, {"t": 0}, standbys=[0, 2], warmups=[2])
    assert ProcessorAssignment.decode(given.encode()) == given
    old = MemberInfo(2, 3, [1])  # a member from before standbys: none of theirs
    assert MemberInfo.decode(old.encode()) == old
