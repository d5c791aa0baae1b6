"""A shrink's staging store holds two processors' keys: each key set's windows close on
its own stream time until the merged processor goes live (``streamkit.runtime.sides``).
Closed on the larger one, a window the retiring processor had not closed would be taken
for sent: its close lost."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import streamkit
from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from stores.base import Checkpoint
from stores.rocksdb import RocksDBStore
from streamkit.context import Outbox
from streamkit.runtime.closes import fire_closes
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.routes import Route, rebuilt_all
from streamkit.windows import Tumbling

P0, BEFORE = 2, 3  # a shrink from 3 processors to 2: processor 2 retires into processor 0


@dataclass
class Clock:
    timestamp: int
    stream_time: int


def key_of(side: int) -> str:
    return next(k for i in range(1000) if lh_bucket(key_hash((k := f"k{i}").encode()), P0, BEFORE) == side)


def test_each_key_set_of_a_staging_store_closes_on_its_own_stream_time(tmp_path: Path) -> None:
    app = streamkit.App("sides")
    per_s = app.table("per_s", default=int, window=Tumbling(1, grace=0))
    sent: list[tuple[str, int, int]] = []

    def closed(key: str, window: streamkit.Window, total: int, ctx: streamkit.Context) -> None:
        sent.append((key, window.start, total))

    app.on_window_close(per_s)(closed)
    callbacks = {"per_s": [closed]}
    mine, retiring = key_of(0), key_of(2)
    path = tmp_path / "processor-0.receiving"
    store = RocksDBStore.open(str(path), list(app.tables))
    proc = ProcessorState(0, store, app.tables)
    proc.hold_sides(P0, BEFORE)

    def apply(key: str, ts: int) -> None:
        per_s.bind(proc.window_states["per_s"], Clock(ts, proc.advance(ts, key.encode())))
        per_s[key] += 1
        per_s.bind(None)

    for key, ts in ((mine, 500), (retiring, 500), (mine, 5_500), (retiring, 2_200)):  # replayed: no output
        apply(key, ts)
    asyncio.run(fire_closes(proc, callbacks, Outbox(), silent=True))
    assert proc.stream_time == 5_500 and proc.sides is not None and proc.sides.times == {0: 5_500, 2: 2_200}
    book = dict(proc.caches["per_s__windows"].items())
    # the retiring keys' window [2, 3) s is open: their processor (stream time 2.2 s) had not closed it
    assert book == {(mine, 0): {"w": [[5_000, 6_000, 0]]}, (retiring, 0): {"w": [[2_000, 3_000, 0]]}}

    proc.commit(Checkpoint(positions={("events", 0): 4}, extra={"p": 2}))  # the stream times go with the store
    proc.close()
    proc = ProcessorState(0, RocksDBStore.open(str(path), list(app.tables)), app.tables)
    assert proc.sides is not None and proc.sides.times == {0: 5_500, 2: 2_200}

    proc.merge_sides()  # live: one stream time, 5.5 s; the retiring keys' [2, 3) s closes now, and is sent
    assert asyncio.run(fire_closes(proc, callbacks, Outbox(), silent=False)) == 1
    assert sent == [(retiring, 2_000, 1)]
    proc.close()


def test_a_record_of_a_key_set_is_judged_late_by_its_own_stream_time(tmp_path: Path) -> None:
    app = streamkit.App("sides-late")
    per_s = app.table("per_s", default=int, window=Tumbling(1, grace=0))
    store = RocksDBStore.open(str(tmp_path / "s"), list(app.tables))
    proc = ProcessorState(0, store, app.tables)
    proc.hold_sides(P0, BEFORE)
    mine, retiring = key_of(0), key_of(2)
    assert proc.advance(9_000, mine.encode()) == 9_000
    # the retiring processor's stream time is its own: 1.5 s is on time for its keys
    at = proc.advance(1_500, retiring.encode())
    assert at == 1_500
    per_s.bind(proc.window_states["per_s"], Clock(1_500, at))
    per_s[retiring] += 1  # would raise LateRecordError on the merged stream time (9 s)
    per_s.bind(None)
    got: dict[Any, Any] = dict(proc.caches["per_s"].items())
    assert got == {(retiring, 1_000): 1}
    proc.close()


def test_the_merged_processor_goes_live_once_nothing_the_group_handled_is_left_or_held() -> None:
    """``rebuilt_all``: the member merges the key sets' stream times only then (before, a
    rebuilt record's silent closes on the merged time would take the other key set's
    windows for sent)."""
    proc = SimpleNamespace(positions={("t", 0): 5, ("t", 1): 12}, pending={})
    other = SimpleNamespace(positions={("t", 2): 0}, pending={})

    def route(owner: Any, partition: int, rebuild_until: int) -> tuple[Any, Route]:
        return partition, Route(owner, [], None, None, ("t", partition), rebuild_until=rebuild_until, committed=0)

    routes = [route(proc, 0, 8), route(proc, 1, 10), route(other, 2, 50)]
    assert not rebuilt_all(proc, routes)  # partition 0: records 5 to 7 are the group's, to rebuild
    proc.positions[("t", 0)] = 9
    proc.pending[("t", 0)] = {7}  # read, but held by the time-ordered merge
    assert not rebuilt_all(proc, routes)
    proc.pending[("t", 0)] = set()
    assert rebuilt_all(proc, routes)  # (another processor's routes do not count)
    assert rebuilt_all(SimpleNamespace(positions={}, pending={}), routes)  # no partitions: nothing to wait for
