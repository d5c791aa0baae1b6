"""A table bound to a write-back cache reads and writes the cache's dicts itself
(``CachedTable.hot_path``): the same state as calling the cache, whatever the sequence
of reads, writes, deletes, checkpoints, evictions, discards, invalidations and rebinds."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stores import CachedTable, Checkpoint, MemoryStore, commit_cached
from stores.serde import serde_for
from streamkit.tables import Table

CP = Checkpoint(positions={("in", 0): 1})
KEY = st.integers(0, 5)

ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), KEY, st.one_of(st.integers(-5, 5), st.none())),  # None is a value
        st.tuples(st.just("add"), KEY),  # t[k] += 1 with a default
        st.tuples(st.just("get"), KEY),
        st.tuples(st.just("getitem"), KEY),
        st.tuples(st.just("del"), KEY),
        st.tuples(st.just("contains"), KEY),
        st.tuples(st.just("commit")),
        st.tuples(st.just("discard")),
        st.tuples(st.just("invalidate")),
        st.tuples(st.just("switch")),  # bind the other processor's cache
    ),
    max_size=80,
)


def _table(default: Any = None) -> Table:
    return Table("t", serde_for("int"), serde_for("json"), default)


@settings(max_examples=60, deadline=None)
@given(ops=ops, max_cached=st.integers(0, 6))
@example(ops=[("set", 1, None), ("get", 1), ("getitem", 1), ("commit",), ("invalidate",), ("get", 1)], max_cached=0)
@example(ops=[("add", 2), ("switch",), ("add", 2), ("commit",), ("switch",), ("discard",), ("get", 2)], max_cached=1)
def test_a_table_over_caches_keeps_each_processors_state_exact(ops: list[tuple[Any, ...]], max_cached: int) -> None:
    plain, counter = _table(), _table(default=int)
    stores = [MemoryStore(["t"]), MemoryStore(["t"])]
    caches = [CachedTable(s, "t", "int", "json", max_cached=max_cached) for s in stores]
    live: list[dict[int, int | None]] = [{}, {}]
    committed: list[dict[int, int | None]] = [{}, {}]
    at = 0
    for table in (plain, counter):
        table.bind(caches[at])
    for op in ops:
        cache, model = caches[at], live[at]
        if op[0] == "set":
            plain[op[1]] = op[2]
            model[op[1]] = op[2]
        elif op[0] == "add":
            if model.get(op[1], 0) is None:
                continue
            counter[op[1]] += 1
            model[op[1]] = (model.get(op[1]) or 0) + 1
        elif op[0] == "get":
            assert plain.get(op[1], "none") == model.get(op[1], "none")
        elif op[0] == "getitem":
            if op[1] in model:
                assert plain[op[1]] == model[op[1]]
            else:
                with pytest.raises(KeyError):
                    plain[op[1]]
                assert counter[op[1]] == 0  # the default, not written
        elif op[0] == "del":
            if op[1] in model:
                del plain[op[1]]
                del model[op[1]]
        elif op[0] == "contains":
            assert (op[1] in plain) == (op[1] in model)
        elif op[0] == "commit":
            commit_cached(stores[at], [cache], CP)
            committed[at] = dict(model)
        elif op[0] == "discard":
            cache.discard()
            live[at] = dict(committed[at])
        elif op[0] == "invalidate":  # what a restore does after writing the store itself
            cache.discard()
            cache.invalidate()
            live[at] = dict(committed[at])
        elif op[0] == "switch":
            at = 1 - at
            for table in (plain, counter):
                table.bind(caches[at])
        for i in (0, 1):
            assert dict(caches[i].items()) == live[i]
    for i in (0, 1):
        commit_cached(stores[i], [caches[i]], CP)
        fresh = CachedTable(stores[i], "t", "int", "json")
        assert dict(fresh.items()) == live[i]


def test_a_table_unbound_or_over_another_backend_goes_through_it() -> None:
    table = _table(default=int)
    for use in (
        lambda: table[1],
        lambda: table.get([1]),  # an unhashable key too: the error says the table is unbound
        lambda: table.__setitem__(1, 2),
        lambda: table.__delitem__(1),
        lambda: [1] in table,
    ):
        with pytest.raises(RuntimeError, match="used outside a handler"):
            use()

    class Guarded(dict):  # a backend that is not a cache: every read and write reaches it
        def get(self, key: Any, default: Any = None) -> Any:
            self.reads = getattr(self, "reads", 0) + 1
            return super().get(key, default)

    backend = Guarded()
    table.bind(backend)
    table[1] += 5
    assert backend == {1: 5} and table[1] == 5 and table.get(2) is None and backend.reads == 3
    table.bind(CachedTable(MemoryStore(["t"]), "t", "int", "json"))
    table[1] += 1
    assert table[1] == 1 and backend == {1: 5}
    table.bind(None)
    with pytest.raises(RuntimeError, match="used outside a handler"):
        table.get(1)


def test_an_unhashable_key_on_a_cached_table_is_the_callers_error_and_spares_the_filter() -> None:
    """A handler's bad key (a dead letter) fails as a dict would, and the table keeps its
    filter of stored keys: the next misses still skip the store."""
    cache = CachedTable(MemoryStore(["t"]), "t", "int", "json")
    table = _table(default=int)
    table.bind(cache)
    for use in (lambda: table[[1]], lambda: table.get([1]), lambda: table.__setitem__([1], 2)):
        with pytest.raises(TypeError, match="unhashable"):
            use()
    assert cache._stored is not None and cache.misses == 0
    assert table[7] == 0 and cache.reads_spared == 1
