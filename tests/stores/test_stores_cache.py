from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stores import CachedTable, Checkpoint, MemoryStore, StoreError, commit_cached

CP = Checkpoint(positions={("in", 0): 1})


class CountingStore(MemoryStore):
    """A MemoryStore that counts point reads."""

    def __init__(self, tables: Any = ("t",)) -> None:
        super().__init__(tables)
        self.gets = 0

    def get(self, table: str, key: bytes) -> bytes | None:
        self.gets += 1
        return super().get(table, key)


def committed(store, table="t", serde=None) -> dict:
    return dict(store.items(table))


def test_basic_dict_semantics(open_store) -> None:
    store = open_store(["t"])
    store.commit({"t": {b'"a"': b"1"}}, CP)
    t = CachedTable(store, "t", "json", "json")
    assert t.get("a") == 1
    assert t["a"] == 1
    assert t.get("zz") is None and t.get("zz", 5) == 5
    assert "a" in t and "zz" not in t
    with pytest.raises(KeyError):
        t["zz"]
    t["b"] = {"x": [1, 2]}
    assert t["b"] == {"x": [1, 2]}
    assert t.setdefault("b", 0) == {"x": [1, 2]}
    assert t.setdefault("c", 7) == 7 and t["c"] == 7
    del t["a"]
    assert "a" not in t
    with pytest.raises(KeyError):
        del t["a"]
    with pytest.raises(KeyError):
        del t["never"]
    assert t.pop("c") == 7
    assert t.pop("c", "dflt") == "dflt"
    with pytest.raises(KeyError):
        t.pop("c")
    assert t.pending() == {b'"a"': None, b'"b"': b'{"x":[1,2]}', b'"c"': None}
    # nothing reached the store yet
    assert committed(store) == {b'"a"': b"1"}
    commit_cached(store, [t], CP)
    assert committed(store) == {b'"b"': b'{"x":[1,2]}'}
    assert t.pending() == {} and t.dirty_count == 0


def test_none_value_is_a_value() -> None:
    store = MemoryStore(["t"])
    t = CachedTable(store, "t", "str", "json")
    t["k"] = None
    assert "k" in t
    assert t.get("k", "dflt") is None
    assert t.pending() == {b"k": b"null"}


def test_hits_and_repeated_misses_do_not_touch_the_store() -> None:
    store = CountingStore()
    store.commit({"t": {b"\x00" * 7 + b"\x01": b"10"}}, CP)
    t = CachedTable(store, "t", "int", "json")
    for _ in range(1000):
        assert t.get(1) == 10
        assert t.get(2) is None  # negative cache
        assert 3 not in t
    # the store is read for the key it holds; the two it lacks, the filter of its keys answers
    assert (store.gets, t.misses, t.reads_spared) == (1, 3, 2)
    for _ in range(1000):
        t[1] = t[1] + 1
    assert store.gets == 1


def test_pending_serialises_only_dirty_keys_once() -> None:
    calls = []

    class Spy:
        def dumps(self, obj: Any) -> bytes:
            calls.append(obj)
            return str(obj).encode()

        def loads(self, data: bytes) -> Any:
            return int(data)

    store = MemoryStore(["t"])
    t = CachedTable(store, "t", "str", Spy())
    for i in range(100):
        t["hot"] = i
    t.get("clean")
    assert t.pending() == {b"hot": b"99"}
    assert calls == [99]


def test_discard_drops_uncommitted_changes() -> None:
    store = CountingStore()
    store.commit({"t": {b"a": b"1", b"b": b"2"}}, CP)
    t = CachedTable(store, "t", "str", "json")
    assert t["a"] == 1
    t["a"] = 100
    del t["b"]
    t["new"] = 5
    t.discard()
    assert t.pending() == {}
    assert t["a"] == 1 and t["b"] == 2 and "new" not in t


def test_discard_keeps_clean_entries_cached() -> None:
    store = CountingStore()
    store.commit({"t": {b"a": b"1"}}, CP)
    t = CachedTable(store, "t", "str", "json")
    t.get("a")
    t.get("missing")
    t["x"] = 1
    t.discard()
    before = store.gets
    t.get("a")
    t.get("missing")
    assert store.gets == before


def test_invalidate_rereads_the_store() -> None:
    store = MemoryStore(["t"])
    t = CachedTable(store, "t", "str", "json")
    assert t.get("a") is None
    store.commit({"t": {b"a": b"1"}}, CP)  # written behind the cache's back
    assert t.get("a") is None  # negative cache is stale, as documented
    t.invalidate()
    assert t.get("a") == 1


def test_items_merges_store_and_uncommitted_in_key_order() -> None:
    store = MemoryStore(["t"])
    store.commit({"t": {b"b": b"1", b"d": b"2", b"f": b"3"}}, CP)
    t = CachedTable(store, "t", "str", "json")
    t["a"] = 0  # new, before everything
    t["d"] = 20  # update
    del t["f"]  # delete
    t["e"] = 4  # new, in between
    t["z"] = 9  # new, after everything
    t["g"] = 1
    del t["g"]  # new then deleted
    assert list(t.items()) == [("a", 0), ("b", 1), ("d", 20), ("e", 4), ("z", 9)]
    assert list(t.keys()) == ["a", "b", "d", "e", "z"]


def test_items_hands_out_cached_objects() -> None:
    store = MemoryStore(["t"])
    store.commit({"t": {b"a": b"[1]"}}, CP)
    t = CachedTable(store, "t", "str", "json")
    v = t["a"]
    assert dict(t.items())["a"] is v


def test_eviction_bounds_memory_and_keeps_recent_writes() -> None:
    store = CountingStore()
    t = CachedTable(store, "t", "int", "int", max_cached=50)
    for i in range(200):
        t.get(i)  # 200 negative entries
    for i in range(200, 230):
        t[i] = i
    assert t.cached_count == 230  # nothing evicted between checkpoints
    commit_cached(store, [t], CP)
    assert t.cached_count == 50
    gets = store.gets
    for i in range(200, 230):  # the 30 keys written last interval survived
        assert t[i] == i
    assert store.gets == gets
    for i in range(180, 200):  # the most recently loaded reads fill the rest
        assert t.get(i) is None
    assert store.gets == gets
    assert t.get(0) is None  # evicted, and never stored: the filter of stored keys answers
    assert store.gets == gets


def test_eviction_spares_a_key_written_last_interval_wherever_it_entered() -> None:
    store = CountingStore()
    t = CachedTable(store, "t", "int", "int", max_cached=10)
    for i in range(100):
        t.get(i)  # 0 entered first: the front of the cache
    t[0] = 7  # written in place: it stays at the front
    commit_cached(store, [t], CP)
    assert t.cached_count == 10
    gets = store.gets
    assert t[0] == 7  # spared: no store read
    for i in range(91, 100):  # the newest reads fill the rest
        assert t.get(i) is None
    assert store.gets == gets
    t[5] = 5  # a second interval with more written keys than the limit: all are kept until written
    for i in range(20, 40):
        t[i] = i
    commit_cached(store, [t], CP)
    assert t.cached_count == 10
    assert dict(t.items()) == {0: 7, 5: 5, **{i: i for i in range(20, 40)}}


def test_eviction_zero_keeps_nothing() -> None:
    store = MemoryStore(["t"])
    t = CachedTable(store, "t", "int", "int", max_cached=0)
    t[1] = 1
    commit_cached(store, [t], CP)
    assert t.cached_count == 0
    assert t[1] == 1


def test_commit_cached_many_tables_one_commit() -> None:
    store = MemoryStore(["a", "b"])
    commits = []
    orig = store.commit

    def spy(changes, checkpoint):
        commits.append(({t: dict(kv.items()) for t, kv in changes.items()}, checkpoint))  # read during the commit
        orig(changes, checkpoint)

    store.commit = spy  # type: ignore[method-assign]
    a = CachedTable(store, "a", "str", "int")
    b = CachedTable(store, "b", "str", "int")
    a["x"] = 1
    b["y"] = 2
    commit_cached(store, [a, b], CP)
    assert len(commits) == 1
    assert commits[0][0] == {"a": {b"x": (1).to_bytes(8, "big")}, "b": {b"y": (2).to_bytes(8, "big")}}
    with pytest.raises(StoreError, match="two CachedTables"):
        commit_cached(store, [a, CachedTable(store, "a")], CP)


def test_failed_commit_keeps_dirty_state() -> None:
    store = MemoryStore(["t"])
    t = CachedTable(store, "t", "str", "json")
    t["k"] = 1
    with pytest.raises(StoreError):
        commit_cached(store, [t], Checkpoint(extra={"bad": object()}))
    assert t.pending() == {b"k": b"1"}
    commit_cached(store, [t], CP)
    assert committed(store) == {b"k": b"1"}


def test_constructor_errors() -> None:
    store = MemoryStore(["t"])
    with pytest.raises(StoreError, match="unknown table 'nope'"):
        CachedTable(store, "nope")
    with pytest.raises(ValueError, match="'yaml'"):
        CachedTable(store, "t", "yaml")
    other = MemoryStore(["t"])
    with pytest.raises(StoreError, match="belongs to store"):
        commit_cached(other, [CachedTable(store, "t")], CP)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.integers(0, 15), st.integers(-5, 5)),
        st.tuples(st.just("del"), st.integers(0, 15)),
        st.tuples(st.just("get"), st.integers(0, 15)),
        st.tuples(st.just("commit")),
        st.tuples(st.just("discard")),
        st.tuples(st.just("reopen")),
        st.tuples(st.just("external"), st.integers(0, 15), st.integers(-5, 5)),
    ),
    max_size=60,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops, max_cached=st.integers(0, 8))
def test_model(open_store, ops, max_cached) -> None:
    """CachedTable + store against two dicts: the committed and the live state."""
    import os

    name = f"m-{os.urandom(4).hex()}"
    store = open_store(["t"], name=name)
    t = CachedTable(store, "t", "int", "json", max_cached=max_cached)
    committed_model: dict[int, int] = {}
    live: dict[int, int] = {}
    for op in ops:
        if op[0] == "set":
            t[op[1]] = op[2]
            live[op[1]] = op[2]
        elif op[0] == "del":
            if op[1] in live:
                del t[op[1]]
                del live[op[1]]
            else:
                with pytest.raises(KeyError):
                    del t[op[1]]
        elif op[0] == "get":
            assert t.get(op[1], "none") == live.get(op[1], "none")
        elif op[0] == "commit":
            commit_cached(store, [t], CP)
            committed_model = dict(live)
            assert t.cached_count <= max_cached
        elif op[0] == "discard":
            t.discard()
            live = dict(committed_model)
        elif op[0] == "reopen":
            t.discard()
            live = dict(committed_model)
            store.close()
            store = open_store(["t"], name=name)
            t = CachedTable(store, "t", "int", "json", max_cached=max_cached)
        elif op[0] == "external":  # written past the cache (a restore, a rebuild): invalidated
            store.commit({"t": {op[1].to_bytes(8, "big", signed=True): str(op[2]).encode()}}, CP)
            t.invalidate()
            committed_model[op[1]] = op[2]
            live = dict(committed_model)
        assert dict(t.items()) == live
        assert list(t.keys()) == sorted(live, key=lambda k: k.to_bytes(8, "big", signed=True))
    store.close()


def test_a_byte_budget_bounds_the_cache_whatever_the_number_of_keys(tmp_path) -> None:
    """Two tables share a budget; after checkpoints of many keys each keeps about its
    share in bytes (by its own estimate of an entry's size), and every value is still
    read back right, from the store once evicted."""
    from stores.cache import CacheBudget, CachedTable, commit_cached, deep_size
    from stores.rocksdb import RocksDBStore

    budget = CacheBudget(1 << 20)
    store = RocksDBStore.open(str(tmp_path / "s"), ["a", "b"])
    try:
        tables = [CachedTable(store, t, "json", "json", max_cached=1 << 40, budget=budget) for t in ("a", "b")]
        assert budget.members == 2 and budget.share == 1 << 19
        for start in range(0, 40_000, 10_000):
            for i in range(start, start + 10_000):
                for t in tables:
                    t[i] = [i, "x" * 20]
            commit_cached(store, tables, Checkpoint.empty())
        for t in tables:
            assert t.entry_bytes >= deep_size([1, "x" * 20])
            assert 0 < t.cached_count <= t.limit < 40_000
            assert t.cached_count * t.entry_bytes <= budget.share
            assert all(t[i] == [i, "x" * 20] for i in range(0, 40_000, 7))
        tables[0].release()
        assert budget.members == 1 and budget.share == 1 << 20
    finally:
        store.close()


def test_stores_sharing_memory_stay_exact(tmp_path) -> None:
    """Stores opened with one SharedMemory (block cache, memtable budget, bloom filters)
    read back what they wrote, across a reopen; the memtables they use are counted once."""
    from stores.rocksdb import RocksDBStore, SharedMemory

    shared = SharedMemory(block_cache_bytes=8 << 20, memtable_bytes=8 << 20)
    stores = [RocksDBStore.open(str(tmp_path / f"s{i}"), ["t"], configure=shared) for i in range(2)]
    for n, store in enumerate(stores):
        store.commit({"t": {b"k%d" % i: b"v%d-%d" % (n, i) for i in range(20_000)}}, Checkpoint.empty())
    assert shared.usage()[1] > 0
    for store in stores:
        store.close()
    for n in range(2):
        store = RocksDBStore.open(str(tmp_path / f"s{n}"), ["t"], configure=shared)
        try:
            assert store.get("t", b"k123") == b"v%d-123" % n and store.get("t", b"absent") is None
        finally:
            store.close()


def test_raw_keys_commit_as_they_are_and_anything_else_is_refused(open_store) -> None:
    """A raw-key table hands its keys to the store's batch unconverted: puts and deletes
    land, and a key that is not bytes fails the commit whole, leaving the changes dirty."""
    store = open_store(["t"])
    t = CachedTable(store, "t", "raw", "json")
    t[b"a"], t[b"b"], t[b"c"] = 1, [2, 3], {"x": 4}
    commit_cached(store, [t], CP)
    del t[b"b"]
    t[b"c"] = 5
    commit_cached(store, [t], CP)
    assert committed(store) == {b"a": b"1", b"c": b"5"}
    t[b"d"] = 6
    t["e"] = 7  # not bytes
    with pytest.raises(TypeError, match="bytes"):
        commit_cached(store, [t], CP)
    assert committed(store) == {b"a": b"1", b"c": b"5"}
    assert t.dirty_count == 2


def test_raw_keys_are_handed_to_the_store_unconverted() -> None:
    """The store, not the serde, refuses a raw key that is not bytes: the commit path does
    not call the key serde per key."""
    t = CachedTable(MemoryStore(["t"]), "t", "raw", "json")
    t[b"a"], t["b"] = 1, 2
    got: list[tuple[Any, bytes, str]] = []
    t.changes().write_to(lambda k, v, cf: got.append((k, v, cf)), lambda k, cf: None, "cf")
    assert got == [(b"a", b"1", "cf"), ("b", b"2", "cf")]
