"""assignors.placement: key -> processor, shared-task filters, assignments, S2."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assignors.linear_hashing import ancestors, bucket_modulus, lh_base, lh_bucket
from assignors.placement import (
    KeyFilter,
    assign_partitions,
    assign_processors_to_members,
    partitions_for_processor,
    processor_for_hash,
    processor_key_sources,
    processors_for_partition,
)

hashes = st.integers(min_value=0, max_value=2**31 - 1)
small = st.integers(min_value=1, max_value=12)


def route(h: int, n0: int, n: int, p0: int, p: int) -> int:
    """The processor a record with hash h reaches: its partition, then the one
    processor of that partition whose filter accepts h."""
    part = lh_bucket(h, n0, n)
    takers = [q for q, f in processors_for_partition(part, n0, n, p0, p).items() if f is None or f.accepts(h)]
    assert len(takers) == 1, (h, part, takers)
    return takers[0]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(hashes, min_size=1, max_size=30),
    small,
    small,
    st.integers(0, 12),
    st.lists(st.integers(0, 30), min_size=1, max_size=5),
)
def test_key_to_processor_unchanged_by_partition_expansion(
    hs: list[int], n0: int, p0: int, dp: int, growth: list[int]
) -> None:
    p = p0 + dp
    counts = [n0]
    for g in growth:
        counts.append(counts[-1] + g)
    for h in hs:
        procs = {route(h, n0, n, p0, p) for n in counts}
        assert procs == {processor_for_hash(h, p0, p)}


@settings(max_examples=150, deadline=None)
@given(small, st.integers(0, 40), small, st.integers(0, 30), st.data())
def test_filters_partition_each_partition_exactly(n0: int, dn: int, p0: int, dp: int, data: st.DataObject) -> None:
    n, p = n0 + dn, p0 + dp
    part = data.draw(st.integers(0, n - 1))
    shares = processors_for_partition(part, n0, n, p0, p)
    m = bucket_modulus(part, n0, n)
    span = math.lcm(m, 2 * lh_base(p0, p))
    h = part + m * np.arange(2 * span // m, dtype=np.int64)  # every class, twice over
    owner = np.array([lh_bucket(int(x), p0, p) for x in h])
    if len(shares) == 1:
        ((q, flt),) = shares.items()
        assert flt is None and np.all(owner == q)
        return
    accepted = np.zeros(h.size, dtype=np.int64)
    for q, flt in shares.items():
        assert flt is not None
        mask = flt.accepts_batch(h)
        assert [flt.accepts(int(x)) for x in h] == mask.tolist()
        assert np.all(owner[mask] == q)  # the filter selects exactly q's hashes
        accepted += mask
    assert np.all(accepted == 1)  # each hash of the partition: exactly one processor


def test_whole_partitions_when_n0_over_p0_is_a_power_of_two() -> None:
    for n0, p0 in [(10, 10), (8, 2), (2, 8), (12, 3), (5, 20)]:
        for p in range(p0, 2 * p0 + 2):
            for n in range(max(n0, p), 2 * max(n0, p) + 3):
                for part in range(n):
                    # the rule of processor expansion: partition -> processor by linear hashing
                    assert processors_for_partition(part, n0, n, p0, p) == {lh_bucket(part, p0, p): None}


def test_shared_tasks_when_ratio_is_not_a_power_of_two() -> None:
    # p0 divides n0: whole at p == p0, shared after processor growth ...
    assert processors_for_partition(0, 3, 3, 1, 1) == {0: None}
    assert processors_for_partition(0, 3, 3, 1, 2) == {0: KeyFilter(6, frozenset({0})), 1: KeyFilter(6, frozenset({3}))}
    # ... p0 does not divide n0: shared from the start.
    assert len(processors_for_partition(0, 3, 3, 2, 2)) == 2
    # more processors than partitions (shared tasks)
    assert processors_for_partition(1, 2, 2, 2, 4) == {1: KeyFilter(4, frozenset({1})), 3: KeyFilter(4, frozenset({3}))}


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(st.sampled_from("abcdef"), st.tuples(small, st.integers(0, 20)), min_size=1, max_size=3),
    small,
    st.integers(0, 20),
    st.lists(hashes, min_size=1, max_size=20),
)
def test_assign_partitions_covers_every_hash_once(
    spec: dict[str, tuple[int, int]], p0: int, dp: int, hs: list[int]
) -> None:
    topics = {t: (n0, n0 + dn) for t, (n0, dn) in spec.items()}
    p = p0 + dp
    assignment = assign_partitions(topics, p0, p)
    assert sorted(assignment) == list(range(p))
    for q, entries in assignment.items():
        assert entries == sorted(entries, key=lambda e: (e[0], e[1]))
        for topic, part, _ in entries:
            assert part in partitions_for_processor(q, *topics[topic], p0, p)
    for topic, (n0, n) in topics.items():
        for h in hs:
            part = lh_bucket(h, n0, n)
            owners = [
                q
                for q, entries in assignment.items()
                for t, pt, f in entries
                if t == topic and pt == part and (f is None or f.accepts(h))
            ]
            assert owners == [lh_bucket(h, p0, p)]


def test_processor_key_sources_seed_example() -> None:
    # After 10 -> 15 processors and 18 partitions: processor 12 owns h % 20 == 12,
    # i.e. partition 12, split from partition 2 (S1 = {12}, S2 = {2, 12}).
    assert processor_key_sources(12, {"t": (10, 18)}, 10, 15) == {"t": {2, 12}}
    assert processor_key_sources(5, {"t": (10, 18)}, 10, 15) == {"t": {5, 15}}
    assert processor_key_sources(5, {"t": (10, 15)}, 10, 15) == {"t": {5}}
    assert processor_key_sources(2, {"t": (10, 12)}, 10, 12, high_water={"t": 25}) == {"t": {2, 12, 22}}


@settings(max_examples=100, deadline=None)
@given(small, st.integers(0, 30), small, st.integers(0, 20), st.data())
def test_processor_key_sources_brute_force(n0: int, dn: int, p0: int, dp: int, data: st.DataObject) -> None:
    n, p = n0 + dn, p0 + dp
    proc = data.draw(st.integers(0, p - 1))
    s1 = {part for part in range(n) if proc in processors_for_partition(part, n0, n, p0, p)}
    assert set(partitions_for_processor(proc, n0, n, p0, p)) == s1
    s2 = set(s1)
    for part in s1:
        s2.update(ancestors(part, n0))
    assert processor_key_sources(proc, {"t": (n0, n)}, p0, p) == {"t": s2}


def test_key_filter() -> None:
    f = KeyFilter(6, frozenset({0, 3}))
    assert f.accepts(12) and f.accepts(9) and not f.accepts(4)
    h = np.arange(12, dtype=np.uint32)
    assert f.accepts_batch(h).tolist() == [x % 3 == 0 for x in range(12)]
    with pytest.raises(ValueError):
        KeyFilter(0, frozenset({0}))
    with pytest.raises(ValueError):
        KeyFilter(4, frozenset())
    with pytest.raises(ValueError):
        KeyFilter(4, frozenset({4}))
    with pytest.raises(AttributeError):
        f.modulus = 3  # type: ignore[misc]


def test_validation() -> None:
    with pytest.raises(ValueError):
        processors_for_partition(0, 10, 9, 10, 10)
    with pytest.raises(ValueError):
        processors_for_partition(0, 10, 10, 10, 9)
    with pytest.raises(ValueError, match="out of range"):
        processors_for_partition(10, 10, 10, 10, 10)
    with pytest.raises(ValueError, match="out of range"):
        partitions_for_processor(10, 10, 10, 10, 10)
    with pytest.raises(ValueError):
        assign_partitions({"t": (4, 4)}, 0, 1)
    with pytest.raises(ValueError):
        assign_processors_to_members({"a": []}, -1)


# --- the worked example of docs/design.md, "Keys to processors" ---------------------------------------------


def test_worked_example_of_partition_and_processor_growth() -> None:
    """10 partitions and 10 processors; partitions -> 15; processors -> 15; partitions -> 18."""
    rng = random.Random(1)
    keys = [rng.randbytes(rng.randrange(1, 24)) for _ in range(4000)]
    from assignors.vectorized import key_hash_batch

    hs = key_hash_batch(keys).astype(np.int64).tolist()
    steps = [(10, 10), (15, 10), (15, 15), (18, 15)]  # (partitions, processors)
    where = []  # per step: [(partition, processor)] per key
    for n, p in steps:
        assignment = assign_partitions({"in": (10, n)}, 10, p)
        # no shared tasks anywhere: every partition is wholly owned (p0 == n0, n >= p)
        assert all(f is None for entries in assignment.values() for _, _, f in entries)
        owner = {part: q for q, entries in assignment.items() for _, part, _ in entries}
        assert sorted(owner) == list(range(n))
        row = []
        for h in hs:
            part = lh_bucket(h, 10, n)
            proc = owner[part]
            assert proc == route(h, 10, n, 10, p) == lh_bucket(part, 10, p)  # the rule
            row.append((part, proc))
        where.append(row)

    for i, h in enumerate(hs):
        (p0_, q0), (p1, q1), (p2, q2), (p3, q3) = (w[i] for w in where)
        # start: Kafka's default placement, processor = partition
        assert p0_ == h % 10 and q0 == h % 10
        # partitions 10 -> 15: partitions 0..4 split into 10..14; no processor changes
        assert p1 == (h % 20 if h % 10 < 5 else h % 10)
        assert q1 == q0
        # processors 10 -> 15: only keys of split buckets 0..4 move, to processors 10..14
        assert p2 == p1
        if h % 10 < 5 and h % 20 >= 10:
            assert q2 == h % 20 and q2 >= 10 and q1 == q2 - 10
        else:
            assert q2 == q1
        # partitions 15 -> 18: partitions 5, 6, 7 split into 15, 16, 17; no processor changes
        assert p3 == (h % 20 if h % 10 < 8 else h % 10)
        assert q3 == q2
        if p3 in (15, 16, 17):
            assert q3 == p3 - 10  # new partition goes to its parent's processor

    moved = [sum(a[1] != b[1] for a, b in zip(where[s], where[s + 1])) for s in range(3)]
    assert moved[0] == 0 and moved[2] == 0
    assert 0.2 < moved[1] / len(hs) < 0.3  # 5 of 10 buckets split: about a quarter


# --- member assignment -------------------------------------------------------------------


def check_valid(result: dict[str, list[int]], names: list[str], p: int) -> None:
    assert sorted(result) == sorted(names)
    ids = [q for qs in result.values() for q in qs]
    assert sorted(ids) == list(range(p))
    counts = [len(qs) for qs in result.values()]
    assert max(counts) - min(counts) <= 1
    assert all(qs == sorted(qs) for qs in result.values())


member_maps = st.dictionaries(
    st.text("abcdefgh", min_size=1, max_size=3),
    st.lists(st.integers(-2, 40), max_size=12),
    min_size=1,
    max_size=7,
)


@settings(max_examples=300, deadline=None)
@given(member_maps, st.integers(0, 40))
def test_members_balanced_sticky_deterministic(members: dict[str, list[int]], p: int) -> None:
    result = assign_processors_to_members(members, p)
    names = sorted(members)
    check_valid(result, names, p)
    # deterministic: the mapping's order does not matter
    assert assign_processors_to_members(dict(reversed(list(members.items()))), p) == result
    # sticky: each member keeps as many of its (uncontested, valid) ids as its quota allows
    claimed: set[int] = set()
    for name in names:
        mine = {q for q in members[name] if 0 <= q < p} - claimed
        claimed |= mine
        assert len(mine & set(result[name])) == min(len(mine), len(result[name]))
    # a balanced valid assignment is a fixed point
    assert assign_processors_to_members(result, p) == result


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(0, 30))
def test_members_scaling_moves_little(k: int, p: int) -> None:
    names = [f"m{i}" for i in range(k)]
    start = assign_processors_to_members({n: [] for n in names}, p)
    # one more processor: nobody loses an id, the new id lands somewhere
    grown = assign_processors_to_members(start, p + 1)
    check_valid(grown, names, p + 1)
    assert all(set(start[n]) <= set(grown[n]) for n in names)
    # a member joins: existing members only give ids away, the newcomer only receives
    joined = assign_processors_to_members({**start, "zz": []}, p)
    check_valid(joined, [*names, "zz"], p)
    assert all(set(joined[n]) <= set(start[n]) for n in names)
    moved = sum(len(set(start[n]) - set(joined[n])) for n in names)
    assert moved == len(joined["zz"])
    # a member leaves: the others keep everything they had
    if k > 1:
        left = assign_processors_to_members({n: start[n] for n in names[1:]}, p)
        check_valid(left, names[1:], p)
        assert all(set(start[n]) <= set(left[n]) for n in names[1:])


def test_members_examples() -> None:
    assert assign_processors_to_members({}, 5) == {}
    assert assign_processors_to_members({"a": []}, 0) == {"a": []}
    assert assign_processors_to_members({"b": [0, 1, 2], "a": [3, 4, 5], "c": []}, 6) == {
        "a": [3, 4],
        "b": [0, 1],
        "c": [2, 5],
    }
    # duplicate and out-of-range ids are ignored; contested ids stay with the first name
    assert assign_processors_to_members({"a": [0, 0, 9], "b": [0, 1]}, 2) == {"a": [0], "b": [1]}


@pytest.mark.parametrize("p", [1, 5, 40, 100, 300])
def test_single_partition_shared_by_many_processors(p: int) -> None:
    # One partition, p processors (> 64 representatives exercises the numpy path):
    # each processor q takes exactly its own bucket's residue class.
    shares = processors_for_partition(0, 1, 1, 1, p)
    if p == 1:
        assert shares == {0: None}
        return
    assert shares == {q: KeyFilter(bucket_modulus(q, 1, p), frozenset({q})) for q in range(p)}
    assert sorted(assign_partitions({"t": (1, 1)}, 1, p)) == list(range(p))


def test_members_host_the_sharers_of_a_partition_together_when_balance_allows() -> None:
    # 2 partitions, job 2 -> 5 processors: partition 0's keys are on 0, 2 and 4, partition 1's on 1 and 3
    sharers = {0: [], 1: []}
    for part in range(2):
        sharers[part] = sorted(processors_for_partition(part, 2, 2, 2, 5))
    assert sharers == {0: [0, 2, 4], 1: [1, 3]}
    together = [sharers[0], sharers[1]]
    assert assign_processors_to_members({"a": [0], "b": [1]}, 5, together) == {"a": [0, 2, 4], "b": [1, 3]}
    assert assign_processors_to_members({"a": [0], "b": [1]}, 5) == {"a": [0, 2, 3], "b": [1, 4]}
    # balance first: one partition, four sharers, two members: two each
    assert assign_processors_to_members({"a": [], "b": []}, 4, [[0, 1, 2, 3]]) == {"a": [0, 1], "b": [2, 3]}
