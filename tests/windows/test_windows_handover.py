"""An in-place handover (a growth step whose splitting processor is hosted beside the
joined one): at T1 the joined processor's windows and books become the old owner's
(``streamkit.runtime.key_sets.adopt_windows``). The joined processor rebuilt them from its
own partitions on its own stream time; the old owner, reading more partitions, may have
been ahead, closed and sent a session, and judged its next records late. Rebuilt, that
session would still be open: it would take those records and be sent a second time."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import streamkit
from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from stores.base import Checkpoint
from stores.rocksdb import RocksDBStore
from streamkit.context import Outbox
from streamkit.runtime.closes import fire_closes
from streamkit.runtime.key_sets import adopt_windows
from streamkit.runtime.processor import ProcessorState
from streamkit.windows import Session

P0, P = 2, 4  # growth from 3 to 4 processors: processor 3 takes keys of processor 1
OLD, JOINED = 1, 3


@dataclass
class Clock:
    timestamp: int
    stream_time: int


def key_of(pid: int, n: int = 0) -> str:
    keys = (k for i in range(10_000) if lh_bucket(key_hash((k := f"k{i}").encode()), P0, P) == pid)
    for _ in range(n):
        next(keys)
    return next(keys)


def test_the_joined_processor_takes_the_old_owners_windows_at_the_handover(tmp_path: Path) -> None:
    app = streamkit.App("handover-windows")
    sessions = app.table("sessions", default=int, window=Session(1, grace=0))
    sent: list[tuple[str, int, int, int]] = []

    def closed(key: str, window: streamkit.Window, total: int, ctx: streamkit.Context) -> None:
        sent.append((key, window.start, window.end, total))

    app.on_window_close(sessions)(closed)
    callbacks = {"sessions": [closed]}
    moved, stays, own_only = key_of(JOINED), key_of(OLD), key_of(JOINED, 1)

    def open_proc(pid: int) -> ProcessorState:
        return ProcessorState(pid, RocksDBStore.open(str(tmp_path / f"processor-{pid}"), list(app.tables)), app.tables)

    def apply(proc: ProcessorState, key: str, ts: int) -> None:
        proc.stream_time = max(proc.stream_time, ts)
        sessions.bind(proc.window_states["sessions"], Clock(ts, proc.stream_time))
        sessions[key] += 1
        sessions.bind(None)

    at_t1 = Checkpoint(positions={("events", 0): 3}, extra={"p": P})
    # the old owner: the moved key's session [1.0, 1.2] s, then a record of another
    # partition moves its stream time to 9 s: the session closes, and is sent
    old = open_proc(OLD)
    for key, ts in ((moved, 1_000), (moved, 1_200), (stays, 9_000)):
        apply(old, key, ts)
    assert asyncio.run(fire_closes(old, callbacks, Outbox(), silent=False)) == 1
    assert sent == [(moved, 1_000, 1_200, 2)]
    old.commit(at_t1)
    # the joined processor rebuilt the same records of its keys without output, on its
    # own stream time (1.2 s: the other partition's record is not its): the session is
    # open; and it has a session of a record that the old owner judged late
    joined = open_proc(JOINED)
    for key, ts in ((moved, 1_000), (moved, 1_200), (own_only, 1_100)):
        apply(joined, key, ts)
    asyncio.run(fire_closes(joined, callbacks, Outbox(), silent=True))
    joined.commit(at_t1)
    assert dict(joined.caches["sessions__windows"].items()) != dict(
        (k, v) for k, v in old.caches["sessions__windows"].items() if k[0] == moved
    )

    taken = adopt_windows(joined, old, app.tables, P0, P)

    assert taken == 2  # the moved key's session and its book entry; not the key that stays
    book = dict(joined.caches["sessions__windows"].items())
    assert book == {k: v for k, v in old.caches["sessions__windows"].items() if k[0] == moved}
    assert dict(joined.caches["sessions"].items()) == {(moved, 1_000): 2}
    assert joined.loaded.positions == at_t1.positions  # the store is still at T1
    # live from the old owner's stream time on: the session is not sent a second time
    joined.stream_time = 9_000
    sent.clear()
    assert asyncio.run(fire_closes(joined, callbacks, Outbox(), silent=False)) == 0
    assert sent == []
    old.close()
    joined.close()


def test_the_joined_processor_keeps_its_rebuilt_windows_unless_both_stores_applied_the_same_records(
    tmp_path: Path,
) -> None:
    app = streamkit.App("handover-windows-apart")
    sessions = app.table("sessions", default=int, window=Session(1, grace=0))
    app.on_window_close(sessions)(lambda key, window, total, ctx: None)
    moved = key_of(JOINED)

    def proc_at(pid: int, positions: dict, ic_ranges: dict | None = None) -> ProcessorState:
        path = tmp_path / f"p{pid}-{len(list(tmp_path.iterdir()))}"
        proc = ProcessorState(pid, RocksDBStore.open(str(path), list(app.tables)), app.tables)
        sessions.bind(proc.window_states["sessions"], Clock(1_000 + pid, 1_000 + pid))
        sessions[moved] += 1
        sessions.bind(None)
        proc.commit(Checkpoint(positions=positions, ic_ranges=ic_ranges or {}, extra={"p": P}))
        return proc

    old = proc_at(OLD, {("events", 0): 5, ("events", 1): 9})
    behind = proc_at(JOINED, {("events", 0): 4})  # rebuilt to another position: not the same records
    assert adopt_windows(behind, old, app.tables, P0, P) == 0
    assert dict(behind.caches["sessions"].items()) == {(moved, 1_003): 1}
    behind.close()
    old.close()
    # a grown topic's old partition, which the joined processor read to its seal (4) only:
    # the old owner read on there (the other keys' records), the records of its keys are the same
    old = proc_at(OLD, {("events", 0): 9, ("events", 2): 5})
    sealed = proc_at(JOINED, {("events", 0): 4, ("events", 2): 5})
    assert adopt_windows(sealed, old, app.tables, P0, P, read_to_seal=[("events", 0)]) == 2
    assert dict(sealed.caches["sessions"].items()) == {(moved, 1_000 + OLD): 1}
    beyond = proc_at(JOINED, {("events", 0): 10, ("events", 2): 5})  # it read further than the old owner
    assert adopt_windows(beyond, old, app.tables, P0, P, read_to_seal=[("events", 0)]) == 0
    short = proc_at(JOINED, {("events", 0): 4, ("events", 2): 4})  # its own partition: the same offset only
    assert adopt_windows(short, old, app.tables, P0, P, read_to_seal=[("events", 0)]) == 0
    for proc in (old, sealed, beyond, short):
        proc.close()
    old = proc_at(OLD, {("events", 0): 5}, ic_ranges={("events", 0): [(7, 8)]})  # key-concurrent: 7, 8 applied too
    joined = proc_at(JOINED, {("events", 0): 5})
    assert adopt_windows(joined, old, app.tables, P0, P) == 0
    old.close()
    joined.close()
