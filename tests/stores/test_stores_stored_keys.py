"""The filter of a table's stored keys (``stores.stored_keys``) and the cache's use of it:
a miss of a key the store lacks is answered without a store read, and never one of a key
the store holds (the cache's model test, in test_stores_cache, runs its histories with it)."""

from __future__ import annotations

import datetime
import enum
import random
import uuid
from collections.abc import Iterator

import orjson
import pytest

from stores import CachedTable, Checkpoint, MemoryStore, RocksDBStore, stored_keys
from stores.stored_keys import StoredKeys

CP = Checkpoint(positions={("in", 0): 1})


def _keys(rnd: random.Random, n: int) -> list[object]:
    kinds = (
        lambda: rnd.randbytes(rnd.randint(1, 20)),
        lambda: rnd.randbytes(8).hex(),
        lambda: rnd.getrandbits(63) - (1 << 62),
        lambda: (rnd.randbytes(4).hex(), rnd.getrandbits(40)),
    )
    return [rnd.choice(kinds)() for _ in range(n)]


@pytest.mark.parametrize("seed", range(3))
def test_a_filter_never_rules_out_a_key_it_learnt(seed: int) -> None:
    rnd = random.Random(seed)
    learnt, others = _keys(rnd, 40_000), _keys(rnd, 40_000)
    filt = StoredKeys(len(learnt))
    for key in learnt:
        filt.add(key)
    assert all(filt.may_hold(key) for key in learnt)
    known = set(learnt)
    strangers = [key for key in others if key not in known]
    false_positives = sum(filt.may_hold(key) for key in strangers) / len(strangers)
    assert false_positives < 0.04, f"{false_positives:.1%} of keys never learnt pass"
    assert not filt.full


def test_a_scan_grows_until_the_keys_fit_and_refuses_more_than_its_limit() -> None:
    keys = [b"key-%d" % i for i in range(100_000)]
    filt = StoredKeys.scan(lambda: iter(keys), bytes, capacity=1)
    assert filt is not None and filt.capacity >= 2 * len(keys)
    assert all(filt.may_hold(k) for k in keys)
    assert StoredKeys.scan(lambda: iter(keys), bytes, limit=len(keys) - 1) is None
    assert StoredKeys.scan(lambda: iter(keys), bytes, limit=len(keys)) is not None


def test_keys_the_cache_lets_go_are_read_back_and_new_keys_are_not_read(tmp_path) -> None:
    """On a real RocksDB store, a cache that keeps nothing between checkpoints: every key
    it lets go is learnt (past the filter's first size, so it is built again bigger) and
    read back exact; keys never written are answered without a store read."""
    with RocksDBStore.open(str(tmp_path / "s"), ["t"]) as store:
        t = CachedTable(store, "t", "int", "json", max_cached=0)
        n = 20_000
        for start in range(0, n, 2_000):
            for k in range(start, start + 2_000):
                assert t.get(k) is None
                t[k] = [k, -k]
            store.commit({"t": t.changes()}, CP)
            t.mark_clean()
        assert t.reads_spared >= 0.95 * n  # each key was new: nearly none read the store
        misses, spared = t.misses, t.reads_spared
        assert all(t.get(k) == [k, -k] for k in range(n))
        assert t.misses - misses == n and t.reads_spared == spared  # every held key read
        assert all(t.get(k) is None for k in range(n, 2 * n))
        assert t.reads_spared - spared >= 0.95 * n


def test_a_store_written_past_the_cache_is_read_until_scanned_again(tmp_path) -> None:
    with RocksDBStore.open(str(tmp_path / "s"), ["t"]) as store:
        t = CachedTable(store, "t", "int", "json")
        assert t.get(1) is None and t.reads_spared == 1
        store.commit({"t": {(2).to_bytes(8, "big", signed=True): b"7"}}, CP)  # a rebuild's write
        t.invalidate()
        assert t.get(2) == 7 and t.get(3) is None and t.reads_spared == 1  # read, both
        t[4] = 1
        store.commit({"t": t.changes()}, CP)
        t.mark_clean()  # scanned again here
        assert t.get(5) is None and t.reads_spared == 2
        assert CachedTable(store, "t", "int", "json").get(2) == 7  # a new cache scans at once


def test_a_table_beyond_the_scan_limit_is_read_as_before(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(stored_keys, "SCAN_LIMIT", 10)
    with RocksDBStore.open(str(tmp_path / "s"), ["t"]) as store:
        store.commit({"t": {i.to_bytes(8, "big", signed=True): b"1" for i in range(11)}}, CP)
        t = CachedTable(store, "t", "int", "json")
        assert t.get(5) == 1 and t.get(99) is None
        assert t.reads_spared == 0 and t.misses == 2


class ScanCountingStore(MemoryStore):
    """A MemoryStore that counts scans of its tables."""

    def __init__(self) -> None:
        super().__init__(["t"])
        self.scans = 0

    def items(self, table: str, start: bytes | None = None, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        self.scans += 1
        return super().items(table, start, end)


def test_the_first_keys_let_go_need_no_scan_of_the_table() -> None:
    """A table that grew in its cache (nothing let go yet) gets a filter as big as the
    cache when it first lets keys go, not a scan of every key it holds."""
    store = ScanCountingStore()
    t = CachedTable(store, "t", "int", "json", max_cached=5_000)
    assert store.scans == 1  # at construction: empty
    for k in range(20_000):
        t[k] = k
    store.commit({"t": t.changes()}, CP)
    t.mark_clean()  # lets 15,000 go, into a filter made for them
    assert store.scans == 1 and t.cached_count == 5_000
    assert all(t.get(k) == k for k in range(20_000))
    assert t.misses == 15_000 and t.reads_spared == 0
    assert sum(t.get(k) is None for k in range(20_000, 30_000)) == 10_000
    assert t.reads_spared >= 9_500


class Colour(enum.Enum):
    RED = 1


@pytest.mark.parametrize(
    "key", [uuid.UUID(int=7), datetime.date(2026, 11, 29), Colour.RED, "plain", 12], ids=lambda k: type(k).__name__
)
def test_a_key_the_serde_gives_back_as_another_type_is_found(tmp_path, key: object) -> None:
    """JSON writes a UUID or a date as a string and an enum as its value: the scan of a
    reopened table hashes those, so the cache probes the filter with the same form."""
    with RocksDBStore.open(str(tmp_path / "s"), ["t"]) as store:
        t = CachedTable(store, "t", "json", "json", max_cached=0)
        t[key] = 41
        store.commit({"t": t.changes()}, CP)
        t.mark_clean()  # let go: learnt by the filter
        assert t.get(key) == 41
        reopened = CachedTable(store, "t", "json", "json")  # scanned
        assert reopened.get(key) == 41
        loaded = orjson.loads(orjson.dumps(key))  # the form a query by key, or a scan, has
        assert reopened.get(loaded) == 41 and t.get(loaded) == 41


def test_keys_that_come_back_unhashable_turn_the_filter_off(tmp_path) -> None:
    """JSON gives a tuple key back as a list: the filter cannot hash it, so the table is
    read as before (a miss, an eviction, a discard, a scan: none raises)."""
    with RocksDBStore.open(str(tmp_path / "s"), ["t"]) as store:
        t = CachedTable(store, "t", "json", "json", max_cached=0)
        assert t.get(("a", 1)) is None  # a miss probes the filter: off
        t[("a", 1)] = 5
        store.commit({"t": t.changes()}, CP)
        t.mark_clean()
        assert t.get(("a", 1)) == 5 and t.reads_spared == 0
        evicting = CachedTable(store, "t", "json", "json", max_cached=0)  # its scan turns it off
        assert evicting.get(("a", 1)) == 5
        t2 = CachedTable(store, "t", "str", "json", max_cached=0)  # a filter on, then a tuple let go
        t2["k"] = 1
        store.commit({"t": t2.changes()}, CP)
        t2.mark_clean()
        t2[("x", 2)] = 3  # type: ignore[index]
        t2.discard()
        assert t2.get("k") == 1
