"""One suite, both backends (``open_store`` fixture in conftest.py)."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stores import Checkpoint, StoreClosedError, StoreError, StoreLockedError

CP1 = Checkpoint(positions={("in", 0): 10, ("in", 1): 3}, layout_epochs={"in": 2}, generation=7, extra={"n": 1})
CP2 = Checkpoint(
    positions={("in", 0): 20, ("in", 1): 9},
    layout_epochs={"in": 2},
    generation=8,
    ic_ranges={("in", 1): [(11, 12), (15, 15)]},
)


def contents(store, table: str) -> dict[bytes, bytes]:
    return dict(store.items(table))


def test_empty_store(open_store) -> None:
    s = open_store(["a", "b"])
    assert s.tables == ("a", "b")
    assert s.checkpoint() == Checkpoint.empty()
    assert s.get("a", b"k") is None
    assert list(s.items("a")) == []
    assert not s.closed


def test_commit_get_and_table_isolation(open_store) -> None:
    s = open_store(["a", "b"])
    s.commit({"a": {b"k": b"1", b"x": b"2"}, "b": {b"k": b"other"}}, CP1)
    assert s.get("a", b"k") == b"1"
    assert s.get("b", b"k") == b"other"
    assert s.get("b", b"x") is None
    assert s.get_many("a", [b"x", b"nope", b"k"]) == [b"2", None, b"1"]
    assert s.get_many("a", []) == []
    assert s.checkpoint() == CP1


def test_iteration_is_in_byte_order_with_odd_keys(open_store) -> None:
    s = open_store(["t"])
    keys = [b"", b"\x00", b"\x00\x00", b"\x01", b"a", b"ab", b"b", b"\x7f", b"\x80", b"\xff", b"\xff\xff"]
    shuffled = keys[::2] + keys[1::2]
    s.commit({"t": {k: k + b"!" for k in shuffled}}, CP1)
    assert [k for k, _ in s.items("t")] == sorted(keys)
    assert all(v == k + b"!" for k, v in s.items("t"))
    assert s.get("t", b"") == b"!"


def test_items_bounds(open_store) -> None:
    s = open_store(["t"])
    s.commit({"t": {bytes([i]): b"v" for i in range(10)}}, CP1)
    assert [k[0] for k, _ in s.items("t", start=b"\x03")] == list(range(3, 10))
    assert [k[0] for k, _ in s.items("t", end=b"\x03")] == [0, 1, 2]
    assert [k[0] for k, _ in s.items("t", b"\x02", b"\x05")] == [2, 3, 4]
    assert [k[0] for k, _ in s.items("t", b"\x02\x00", b"\x05\x00")] == [3, 4, 5]
    assert list(s.items("t", b"\x05", b"\x05")) == []


def test_items_bounds_made_on_the_fly_hold_through_the_whole_scan(open_store) -> None:
    """A caller's bounds are often temporaries (a key's prefix plus padding): freed while
    the scan goes on, their memory is reused by the keys read. The scan must still give
    every key in the range (a windowed table's key: its windows after the first went
    missing from queries and ``t.windows(key)``)."""
    s = open_store(["t"])
    keys = [b'"k%d"' % i for i in range(40)]
    starts = [(1_700_000_040_000 + 60_000 * w).to_bytes(8, "big") for w in range(3)]
    s.commit({"t": {k + start: b"1" for k in keys for start in starts}}, CP1)
    for key in keys * 5:
        found = [k for k, _ in s.items("t", key + b"\x00" * 8, key + b"\xff" * 8)]
        assert found == [key + start for start in starts], key


def test_items_sees_store_as_of_call(open_store) -> None:
    s = open_store(["t"])
    s.commit({"t": {b"a": b"1", b"b": b"1"}}, CP1)
    it = s.items("t")
    s.commit({"t": {b"c": b"2", b"a": None}}, CP2)
    assert list(it) == [(b"a", b"1"), (b"b", b"1")]


def test_deletes(open_store) -> None:
    s = open_store(["t"])
    s.commit({"t": {b"a": b"1", b"b": b"2"}}, CP1)
    s.commit({"t": {b"a": None, b"never-existed": None}}, CP2)
    assert contents(s, "t") == {b"b": b"2"}
    assert s.get("t", b"a") is None


def test_empty_value_is_not_a_delete(open_store) -> None:
    s = open_store(["t"])
    s.commit({"t": {b"a": b""}}, CP1)
    assert s.get("t", b"a") == b""
    assert contents(s, "t") == {b"a": b""}


def test_checkpoint_only_commit(open_store) -> None:
    s = open_store(["t"])
    s.commit({"t": {b"a": b"1"}}, CP1)
    s.commit({}, CP2)
    assert s.checkpoint() == CP2
    assert contents(s, "t") == {b"a": b"1"}


def test_checkpoint_is_a_copy(open_store) -> None:
    s = open_store(["t"])
    positions = {("in", 0): 1}
    s.commit({}, Checkpoint(positions=positions))
    positions[("in", 0)] = 999  # the caller mutating its dict afterwards
    assert s.checkpoint().positions == {("in", 0): 1}


def test_reopen_returns_exactly_committed_state(open_store) -> None:
    s = open_store(["a", "b"])
    s.commit({"a": {b"k1": b"v1", b"k2": b"v2"}, "b": {b"z": b"1"}}, CP1)
    s.commit({"a": {b"k1": b"v1b", b"k2": None, b"k3": b"v3"}}, CP2)
    s.close()
    s = open_store(["a", "b"])
    assert contents(s, "a") == {b"k1": b"v1b", b"k3": b"v3"}
    assert contents(s, "b") == {b"z": b"1"}
    assert s.checkpoint() == CP2


def test_failed_commit_writes_nothing(open_store) -> None:
    s = open_store(["a", "b"])
    s.commit({"a": {b"k": b"1"}}, CP1)
    with pytest.raises(StoreError, match="unknown table 'nope'"):
        s.commit({"a": {b"k": b"2"}, "nope": {b"x": b"1"}}, CP2)
    with pytest.raises(TypeError):
        s.commit({"a": {b"k": b"2"}, "b": {b"x": "not bytes"}}, CP2)  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        s.commit({"a": {b"k": b"2"}, "b": {"str key": b"1"}}, CP2)  # type: ignore[dict-item]
    with pytest.raises(StoreError):
        s.commit({"a": {b"k": b"2"}}, Checkpoint(extra={"bad": object()}))
    assert contents(s, "a") == {b"k": b"1"}
    assert contents(s, "b") == {}
    assert s.checkpoint() == CP1
    s.close()
    s = open_store(["a", "b"])
    assert contents(s, "a") == {b"k": b"1"}
    assert s.checkpoint() == CP1


def test_table_added_on_reopen_and_unlisted_tables_kept(open_store) -> None:
    s = open_store(["a"])
    s.commit({"a": {b"k": b"1"}}, CP1)
    s.close()
    s = open_store(["b"])
    assert s.tables == ("a", "b")
    assert contents(s, "a") == {b"k": b"1"}
    s.commit({"b": {b"n": b"2"}}, CP2)
    s.close()
    s = open_store([])
    assert s.tables == ("a", "b")
    assert contents(s, "b") == {b"n": b"2"}
    assert s.checkpoint() == CP2


def test_table_named_default_is_an_ordinary_table(open_store) -> None:
    s = open_store(["default"])
    s.commit({"default": {b"k": b"1"}}, CP1)
    assert contents(s, "default") == {b"k": b"1"}


def test_unknown_table_reads(open_store) -> None:
    s = open_store(["a"])
    with pytest.raises(StoreError, match="unknown table 'zz'"):
        s.get("zz", b"k")
    with pytest.raises(StoreError, match="unknown table 'zz'"):
        list(s.items("zz"))


def test_second_open_fails_immediately_naming_path_and_pid(open_store) -> None:
    s = open_store(["a"])
    t0 = time.monotonic()
    with pytest.raises(StoreLockedError) as info:
        open_store(["a"])
    assert time.monotonic() - t0 < 0.5
    err = info.value
    assert err.path == s.path
    assert err.pid == os.getpid()
    assert str(s.path) in str(err)
    assert str(os.getpid()) in str(err)
    s.close()
    s2 = open_store(["a"])  # released by close()
    assert s2.tables == ("a",)


def test_closed_store(open_store) -> None:
    s = open_store(["a"])
    s.close()
    s.close()  # idempotent
    assert s.closed
    with pytest.raises(StoreClosedError):
        s.get("a", b"k")
    with pytest.raises(StoreClosedError):
        s.commit({}, CP1)
    with pytest.raises(StoreClosedError):
        s.checkpoint()


def test_context_manager_closes(open_store) -> None:
    with open_store(["a"]) as s:
        s.commit({"a": {b"k": b"v"}}, CP1)
    assert s.closed
    with open_store(["a"]) as s2:
        assert s2.get("a", b"k") == b"v"


def test_create_false_on_missing_store(open_store) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        open_store(["a"], name="missing", create=False)


def test_name_and_path(open_store, tmp_path) -> None:
    s = open_store(["a"], name="proc-3")
    assert s.name == "proc-3"
    assert s.path == str(tmp_path / "proc-3")
    assert "proc-3" in repr(s)


keys = st.binary(max_size=6)
values = st.binary(max_size=6) | st.none()
commit_lists = st.lists(
    st.dictionaries(st.sampled_from(["a", "b"]), st.dictionaries(keys, values, max_size=8), max_size=2),
    min_size=1,
    max_size=6,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(commits=commit_lists, reopen_every=st.integers(1, 4))
def test_model_random_commits_and_reopens(open_store, commits, reopen_every) -> None:
    """Against a dict model: any sequence of commits, with reopens in between."""
    name = f"model-{os.urandom(4).hex()}"
    model: dict[str, dict[bytes, bytes]] = {"a": {}, "b": {}}
    s = open_store(["a", "b"], name=name)
    for i, changes in enumerate(commits):
        cp = Checkpoint(positions={("in", 0): i + 1})
        s.commit(changes, cp)
        for table, kv in changes.items():
            for k, v in kv.items():
                if v is None:
                    model[table].pop(k, None)
                else:
                    model[table][k] = v
        if (i + 1) % reopen_every == 0:
            s.close()
            s = open_store(["a", "b"], name=name)
        for table in ("a", "b"):
            assert list(s.items(table)) == sorted(model[table].items())
        assert s.checkpoint().position("in", 0) == i + 1
    s.close()
