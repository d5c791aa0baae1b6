"""RocksDB-only behaviour: cross-process locking, SIGKILL, SST ingest, raw mode."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from rocksdict import Options, Rdict, SstFileWriter
from stores_testutil import PYTHON, subprocess_env

from stores import Checkpoint, StoreError, StoreLockedError
from stores.rocksdb import LOCK_FILE, RocksDBStore, store_options, write_sst

CP = Checkpoint(positions={("in", 0): 42}, layout_epochs={"in": 1}, generation=3)

HOLDER = """
import sys, time
from stores import RocksDBStore, Checkpoint
s = RocksDBStore.open(sys.argv[1], ["a"])
s.commit({"a": {b"k": b"from-child"}}, Checkpoint(positions={("in", 0): 5}))
print("LOCKED", flush=True)
time.sleep(60)
"""


def start_holder(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [PYTHON, "-c", HOLDER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if line.strip() != "LOCKED":
        proc.kill()
        raise AssertionError(f"holder did not start: {line!r} {proc.stderr.read()}")  # type: ignore[union-attr]
    return proc


def test_lock_held_by_other_process_then_released_by_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "store"
    proc = start_holder(path)
    try:
        t0 = time.monotonic()
        with pytest.raises(StoreLockedError) as info:
            RocksDBStore.open(path, ["a"])
        elapsed = time.monotonic() - t0
        assert elapsed < 0.5, elapsed
        assert info.value.pid == proc.pid
        assert str(path) in str(info.value) and f"pid {proc.pid}" in str(info.value)
        assert (path / LOCK_FILE).read_text().strip() == str(proc.pid)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    # The kernel dropped the flock with the process: a restart opens at once.
    t0 = time.monotonic()
    with RocksDBStore.open(path, ["a"]) as s:
        assert time.monotonic() - t0 < 2.0
        assert s.get("a", b"k") == b"from-child"
        assert s.checkpoint().position("in", 0) == 5
        assert (path / LOCK_FILE).read_text().strip() == str(os.getpid())


def test_forked_child_does_not_keep_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "store"
    s = RocksDBStore.open(path, ["a"])
    s.commit({"a": {b"k": b"1"}}, CP)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: "closes" its inherited copy, outlives the parent's close(), never execs
        try:
            os.close(r)
            s.close()  # must not flush/close the parent's database or touch its lock
            os.write(w, b"x")
            time.sleep(3)
        finally:
            os._exit(0)
    try:
        os.close(w)
        assert os.read(r, 1) == b"x"
        s.commit({"a": {b"k": b"2"}}, CP.replace(generation=9))  # parent still fine
        s.close()
        with RocksDBStore.open(path, ["a"]) as s2:  # child still alive, lock free
            assert s2.get("a", b"k") == b"2"
            assert s2.checkpoint().generation == 9
    finally:
        os.close(r)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_sync_option_and_configure_hook(tmp_path: Path) -> None:
    calls = []

    def configure(opts: Options) -> None:
        calls.append(opts)
        opts.set_write_buffer_size(1 << 20)

    with RocksDBStore.open(tmp_path / "s", ["a"], sync=True, configure=configure) as s:
        assert s.sync is True
        s.commit({"a": {b"k": b"v"}}, CP)
    assert len(calls) == 1
    with RocksDBStore.open(tmp_path / "s", ["a"]) as s:
        assert s.get("a", b"k") == b"v"
        assert s.checkpoint() == CP


def test_store_is_plain_raw_rocksdb(tmp_path: Path) -> None:
    """Another RocksDB client sees our exact bytes: one column family per table."""
    path = tmp_path / "s"
    with RocksDBStore.open(path, ["a"]) as s:
        s.commit({"a": {b"\x00k": b"\xffv"}}, CP)
    db = Rdict(str(path), Options(raw_mode=True))
    try:
        cf = db.get_column_family("t:a")
        assert list(cf.items()) == [(b"\x00k", b"\xffv")]
        assert Checkpoint.from_bytes(db[b"streamkit/checkpoint"]) == CP
        del cf
    finally:
        db.close()


# ---------------------------------------------------------------- SST ingest


def odd_items(n: int, salt: bytes) -> list[tuple[bytes, bytes]]:
    """Keys with zero bytes, high bytes and the empty key; values include b''."""
    items = {b"": salt + b"empty-key"}
    for i in range(n):
        k = i.to_bytes(3, "big") + (b"\x00" if i % 3 == 0 else b"\xff")
        items[k] = b"" if i % 7 == 0 else salt + i.to_bytes(4, "little")
    return sorted(items.items())


def test_sst_roundtrip_raw_mode(tmp_path: Path) -> None:
    a_items = odd_items(3000, b"a")
    b_items = odd_items(500, b"b")
    a1, a2 = a_items[:1200], a_items[1200:]
    assert write_sst(tmp_path / "a1.sst", a1) == len(a1)
    assert write_sst(tmp_path / "a2.sst", iter(a2), store_options()) == len(a2)
    assert write_sst(tmp_path / "b.sst", b_items) == len(b_items)
    store = RocksDBStore.create_from_sst(
        tmp_path / "store",
        ["a", "b", "c"],
        {"a": [tmp_path / "a2.sst", str(tmp_path / "a1.sst")], "b": [str(tmp_path / "b.sst")]},
        CP,
    )
    with store:
        assert store.tables == ("a", "b", "c")
        assert list(store.items("a")) == a_items
        assert list(store.items("b")) == b_items
        assert list(store.items("c")) == []
        assert store.checkpoint() == CP
        assert store.get("a", b"") == b"aempty-key"
        store.commit({"a": {b"": None}, "c": {b"new": b"1"}}, CP.replace(generation=4))
    assert (tmp_path / "a1.sst").exists()  # copied, not moved, by default
    assert not [p for p in tmp_path.iterdir() if ".building-" in p.name]
    with RocksDBStore.open(tmp_path / "store", ["a", "b", "c"]) as store:
        assert list(store.items("a")) == a_items[1:]
        assert store.get("c", b"new") == b"1"
        assert store.checkpoint().generation == 4


def test_sst_written_without_raw_mode_is_refused(tmp_path: Path) -> None:
    """Negative control for the raw-mode round trip above: an SST written with
    rocksdict's default (non-raw) options uses rocksdict's own comparator and
    key encoding; ingestion refuses it instead of storing unreadable keys."""
    w = SstFileWriter(Options())  # NOT raw mode
    w.open(str(tmp_path / "x.sst"))
    w[b"k"] = b"v"
    w.finish()
    with pytest.raises(StoreError, match="comparator"):
        RocksDBStore.create_from_sst(tmp_path / "s", ["a"], {"a": [str(tmp_path / "x.sst")]}, CP)
    assert not (tmp_path / "s").exists()


def test_create_from_sst_move(tmp_path: Path) -> None:
    write_sst(tmp_path / "a.sst", [(b"k", b"v")])
    with RocksDBStore.create_from_sst(tmp_path / "s", ["a"], {"a": [str(tmp_path / "a.sst")]}, CP, move=True) as s:
        assert s.get("a", b"k") == b"v"


def test_create_from_sst_into_empty_existing_dir(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    write_sst(tmp_path / "a.sst", [(b"k", b"v")])
    with RocksDBStore.create_from_sst(tmp_path / "s", ["a"], {"a": [str(tmp_path / "a.sst")]}, CP) as s:
        assert s.get("a", b"k") == b"v"


def test_create_from_sst_refuses_existing_store_and_bad_input(tmp_path: Path) -> None:
    write_sst(tmp_path / "a.sst", [(b"k", b"v")])
    RocksDBStore.open(tmp_path / "s", ["a"]).close()
    with pytest.raises(StoreError, match="already exists"):
        RocksDBStore.create_from_sst(tmp_path / "s", ["a"], {"a": [str(tmp_path / "a.sst")]}, CP)
    with pytest.raises(StoreError, match="not in"):
        RocksDBStore.create_from_sst(tmp_path / "n1", ["a"], {"zz": [str(tmp_path / "a.sst")]}, CP)
    with pytest.raises(StoreError, match="not found"):
        RocksDBStore.create_from_sst(tmp_path / "n2", ["a"], {"a": [str(tmp_path / "missing.sst")]}, CP)
    (tmp_path / "garbage.sst").write_bytes(b"not an sst")
    with pytest.raises(StoreError, match="ingesting"):
        RocksDBStore.create_from_sst(tmp_path / "n3", ["a"], {"a": [str(tmp_path / "garbage.sst")]}, CP)
    assert not (tmp_path / "n3").exists()
    assert not [p for p in tmp_path.iterdir() if ".building-" in p.name]


def test_write_sst_errors(tmp_path: Path) -> None:
    assert write_sst(tmp_path / "e.sst", []) == 0
    assert not (tmp_path / "e.sst").exists()
    with pytest.raises(StoreError, match="strictly ascending") as info:
        write_sst(tmp_path / "u.sst", [(b"b", b"1"), (b"a", b"1")])
    assert "b'a'" in str(info.value) and "b'b'" in str(info.value)
    assert not (tmp_path / "u.sst").exists()
    with pytest.raises(StoreError, match="strictly ascending"):
        write_sst(tmp_path / "d.sst", [(b"a", b"1"), (b"a", b"2")])
    with pytest.raises(TypeError, match="keys must be bytes"):
        write_sst(tmp_path / "t.sst", [("a", b"1")])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="values must be bytes"):
        write_sst(tmp_path / "t.sst", [(b"a", 1)])  # type: ignore[list-item]
