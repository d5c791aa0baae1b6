"""assignors.linear_hashing: the definition, splits, blockers and key sources."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assignors.linear_hashing import (
    ancestors,
    bucket_modulus,
    deletion_blockers,
    expansion_blockers,
    key_sources,
    lh_base,
    lh_bucket,
    lh_bucket_batch,
    lh_params,
    nearest_ancestor_below,
    parent,
    partition_for_key,
)
from assignors.murmur2 import kafka_partition

hashes = st.integers(min_value=0, max_value=2**31 - 1)
n0s = st.integers(min_value=1, max_value=40)


def lh_definition(h: int, n0: int, n: int) -> int:
    """docs/design.md's wording, literally."""
    level = max(lv for lv in range(40) if n0 * 2**lv <= n)
    split = n - n0 * 2**level
    b = h % (n0 * 2**level)
    if b < split:
        b = h % (n0 * 2 ** (level + 1))
    return b


def all_classes(n0: int, n: int) -> range:
    """Hashes covering every class the layout (n0, n) can tell apart."""
    return range(2 * lh_base(n0, n))


@settings(max_examples=300, deadline=None)
@given(hashes, n0s, st.integers(min_value=0, max_value=300))
def test_bucket_matches_definition(h: int, n0: int, extra: int) -> None:
    n = n0 + extra
    b = lh_bucket(h, n0, n)
    assert b == lh_definition(h, n0, n)
    assert 0 <= b < n
    assert h % bucket_modulus(b, n0, n) == b  # each bucket is one residue class


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=50), st.integers(min_value=1, max_value=5000))
def test_unexpanded_topic_is_kafka_default_partitioner(key: bytes, n: int) -> None:
    assert partition_for_key(key, n, n) == kafka_partition(key, n)


@pytest.mark.parametrize(
    ("n0", "n", "level", "split"),
    [(1, 1, 0, 0), (1, 5, 2, 1), (10, 15, 0, 5), (10, 18, 0, 8), (10, 20, 1, 0), (10, 39, 1, 19), (3, 100, 5, 4)],
)
def test_params(n0: int, n: int, level: int, split: int) -> None:
    assert lh_params(n0, n) == (level, split)


def test_batch_equals_scalar() -> None:
    rng = np.random.default_rng(5)
    h32 = rng.integers(0, 2**31, size=5000, dtype=np.uint32)
    for n0 in (1, 3, 10, 16):
        for n in (n0, n0 + 1, 2 * n0 - 1 if n0 > 1 else 1, 2 * n0, 7 * n0 + 3):
            expected = [lh_bucket(int(h), n0, n) for h in h32]
            got = lh_bucket_batch(h32, n0, n)
            assert got.dtype == np.uint32
            assert got.tolist() == expected
            assert lh_bucket_batch(h32.astype(np.int64), n0, n).tolist() == expected


@settings(max_examples=200, deadline=None)
@given(n0s, st.integers(min_value=0, max_value=200))
def test_growing_by_one_moves_only_the_split_bucket_to_the_new_bucket(n0: int, extra: int) -> None:
    n = n0 + extra
    _, split = lh_params(n0, n)
    h = np.arange(2 * lh_base(n0, n + 1), dtype=np.int64)  # every class of both layouts
    before = lh_bucket_batch(h, n0, n)
    after = lh_bucket_batch(h, n0, n + 1)
    moved = before != after
    assert np.all(before[moved] == split)  # only the split bucket's keys move ...
    assert np.all(after[moved] == n)  # ... all to the new bucket ...
    # ... and exactly half of the split bucket's classes move.
    assert moved.sum() * 2 == (before == split).sum()
    assert parent(n, n0) == split


def test_parent_and_ancestors() -> None:
    assert parent(9, 10) is None
    assert [parent(p, 10) for p in range(10, 20)] == list(range(10))
    assert [parent(p, 10) for p in range(20, 40)] == list(range(20))
    assert ancestors(37, 10) == [17, 7]
    assert ancestors(3, 10) == []
    assert ancestors(12, 1) == [4, 0]


@settings(max_examples=200, deadline=None)
@given(n0s, st.integers(min_value=0, max_value=5000))
def test_ancestor_chain_is_logarithmic(n0: int, p: int) -> None:
    chain = ancestors(p, n0)
    if p < n0:
        assert chain == []
    else:
        assert len(chain) <= math.floor(math.log2(p / n0)) + 1
    assert all(a < b for a, b in zip(chain[1:], chain))
    if chain:
        assert chain[-1] < n0


@settings(max_examples=150, deadline=None)
@given(n0s, st.integers(min_value=0, max_value=60), st.integers(min_value=0, max_value=200))
def test_each_new_partition_has_exactly_one_blocker(n0: int, a: int, b: int) -> None:
    old_n, new_n = n0 + a, n0 + a + b
    blockers = expansion_blockers(n0, old_n, new_n)
    assert set(blockers) == set(range(old_n, new_n))
    h = np.arange(2 * lh_base(n0, new_n), dtype=np.int64)
    old = lh_bucket_batch(h, n0, old_n)
    new = lh_bucket_batch(h, n0, new_n)
    for p, blocker in blockers.items():
        sources = set(old[new == p].tolist())
        assert sources == {blocker}  # every key of p came from one existing partition
        assert blocker < old_n and blocker in ancestors(p, n0)
    # and no key moves between partitions existing before and after
    stay = new < old_n
    assert np.array_equal(old[stay], new[stay])


def brute_deletion(n0: int, old_n: int, new_n: int) -> dict[int, set[int]]:
    h = np.arange(2 * lh_base(n0, old_n), dtype=np.int64)
    old = lh_bucket_batch(h, n0, old_n)
    new = lh_bucket_batch(h, n0, new_n)
    result: dict[int, set[int]] = {}
    for o, n in zip(old.tolist(), new.tolist()):
        if o >= new_n:
            result.setdefault(n, set()).add(o)
    return result


@settings(max_examples=200, deadline=None)
@given(n0s, st.integers(min_value=0, max_value=150), st.data())
def test_deletion_blockers_are_exact(n0: int, extra: int, data: st.DataObject) -> None:
    old_n = n0 + extra
    new_n = data.draw(st.integers(min_value=n0, max_value=old_n))
    blockers = deletion_blockers(n0, old_n, new_n)
    assert blockers == brute_deletion(n0, old_n, new_n)
    # each deleted partition blocks exactly one survivor, an ancestor
    owners = [s for s, ds in blockers.items() for _ in ds]
    assert len(owners) == old_n - new_n
    for s, ds in blockers.items():
        assert s < new_n
        for d in ds:
            assert s in ancestors(d, n0)
            assert nearest_ancestor_below(d, n0, new_n) == s
        # general fan-in bound: deleted buckets refining the survivor's bucket
        assert len(ds) <= 2 * lh_base(n0, old_n) // bucket_modulus(s, n0, new_n) - 1


@settings(max_examples=200, deadline=None)
@given(n0s, st.integers(min_value=0, max_value=400), st.data())
def test_deletion_blockers_logarithmic_when_shrinking_at_most_half(n0: int, extra: int, data: st.DataObject) -> None:
    old_n = n0 + extra
    new_n = data.draw(st.integers(min_value=max(n0, (old_n + 1) // 2), max_value=old_n))
    bound = math.ceil(math.log2(old_n)) + 1
    for ds in deletion_blockers(n0, old_n, new_n).values():
        assert len(ds) <= min(3, bound)


def test_deep_shrink_fan_in_is_inherent() -> None:
    # All 63 deleted partitions' keys land on partition 0: it must wait for all of them.
    assert deletion_blockers(1, 64, 1) == {0: set(range(1, 64))}
    assert brute_deletion(1, 64, 1) == {0: set(range(1, 64))}


def test_key_sources() -> None:
    assert key_sources(17, 10, 18) == {17, 7}
    assert key_sources(7, 10, 18) == {7}
    assert key_sources(37, 10, 40) == {37, 17, 7}
    assert key_sources(2, 10, 18, high_water=25) == {2, 22}
    assert key_sources(2, 10, 12, high_water=40) == {2, 12, 22, 32}


@settings(max_examples=150, deadline=None)
@given(n0s, st.integers(min_value=0, max_value=100), st.data())
def test_key_sources_cover_history(n0: int, extra: int, data: st.DataObject) -> None:
    n = n0 + extra
    p = data.draw(st.integers(min_value=0, max_value=n - 1))
    sources = key_sources(p, n0, n)
    h = np.arange(p, 2 * lh_base(n0, n), bucket_modulus(p, n0, n), dtype=np.int64)
    seen: set[int] = set()
    for count in range(n0, n + 1):  # where the keys of p lived at every earlier count
        seen |= set(lh_bucket_batch(h, n0, count).tolist())
    assert seen == sources


def test_validation() -> None:
    with pytest.raises(ValueError, match="n0"):
        lh_params(0, 5)
    with pytest.raises(ValueError, match=">= the initial count"):
        lh_bucket(3, 10, 9)
    with pytest.raises(ValueError):
        lh_bucket_batch(np.zeros(3, dtype=np.uint32), 4, 3)
    with pytest.raises(ValueError, match="old_n"):
        expansion_blockers(10, 9, 12)
    with pytest.raises(ValueError, match="expansion"):
        expansion_blockers(10, 12, 11)
    with pytest.raises(ValueError, match="new_n"):
        deletion_blockers(10, 20, 9)
    with pytest.raises(ValueError, match="deletion"):
        deletion_blockers(10, 12, 13)
    with pytest.raises(ValueError, match="out of range"):
        key_sources(18, 10, 18)
    with pytest.raises(ValueError, match="high_water"):
        key_sources(1, 10, 18, high_water=17)
    with pytest.raises(ValueError):
        parent(-1, 3)
    with pytest.raises(ValueError):
        parent(4, 0)
    with pytest.raises(ValueError, match="out of range"):
        bucket_modulus(5, 2, 5)
    with pytest.raises(ValueError):
        nearest_ancestor_below(30, 10, 5)
