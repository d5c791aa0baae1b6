"""Corners of windows a review found: a count table counted once per record whatever
calls it, a record that fails to decode in a key-concurrent route does not hold closes
back, and the offline replay (the Spark backfill's) runs session and count tables."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

import streamkit
from streamkit.replay import Replayer
from streamkit.testing import TestDriver
from streamkit.windows import Count, Session, Tumbling


def test_a_count_table_counts_each_record_once_for_every_handler_and_call() -> None:
    app = streamkit.App("counts")
    events = app.topic("events")
    per_3 = app.table("per_3", default=int, window=Count(3))

    @app.processor(events)
    def first(key: str, value: Any, ctx: streamkit.Context) -> None:
        per_3.update(key, lambda n: n + 1)
        per_3.update(f"{key}-shadow", lambda n: n)  # another key in between ...
        per_3.update(key, lambda n: n)  # ... then the same record again: not counted again

    @app.processor(events)
    def second(key: str, value: Any, ctx: streamkit.Context) -> None:
        per_3.update(key, lambda n: n + 10)

    with TestDriver(app) as driver:
        for i in range(5):
            driver.send("events", "k", {}, timestamp=i)
        # records 0-2 closed (deleted), 3-4 open: each counted once, both handlers applied
        assert driver.table("per_3") == {("k", 3): 22, ("k-shadow", 3): 0}
        book = {"w": [[3, 6, 0]], "n": 5}
        assert driver.table("per_3__windows") == {("k", 0): book, ("k-shadow", 0): book}


def test_a_record_that_fails_to_decode_does_not_hold_closes_back() -> None:
    app = streamkit.App("concurrent")
    events = app.topic("events")
    per_10s = app.table("per_10s", default=int, window=Tumbling(10, grace=0))

    @app.processor(events, concurrency=4)
    async def add(key: str, value: Any, ctx: streamkit.Context) -> None:
        await asyncio.sleep(0)
        per_10s[key] += value["n"]

    @app.on_window_close(per_10s)
    def closed(key: str, window: streamkit.Window, total: int, ctx: streamkit.Context) -> None:
        ctx.send("closes", key, {"start": window.start, "total": total})

    with TestDriver(app) as driver:
        driver.send("events", "a", {"n": 1}, timestamp=1)
        driver.send("events", "a", b"{not json", timestamp=2)  # a dead letter
        driver.send("events", "a", {"n": 2}, timestamp=25)  # closes [0, 10) and [10, 20)
        assert [r.value for r in driver.output("closes")] == [{"start": 0, "total": 1}]
        assert [d.reason for d in driver.dead_letters()] == ["value-decode"]


def test_the_offline_replay_runs_session_and_count_tables_one_key_at_a_time() -> None:
    app = streamkit.App("replayed")
    events = app.topic("events")
    visits = app.table("visits", default=int, window=Session(5))
    per_2 = app.table("per_2", default=int, window=Count(2))

    @app.processor(events)
    def add(key: str, value: Any, ctx: streamkit.Context) -> None:
        visits[key] += 1
        per_2.update(key, lambda n: n + 1)

    records = [(orjson.dumps({}), ts, 0, i) for i, ts in enumerate((1_000, 3_000, 20_000))]
    out = Replayer(app, "events").run_key(b"k", records)
    ks = visits.store_key_serde
    assert {ks.loads(k): orjson.loads(v) for k, v in out["visits"].items()} == {("k", 1_000): 2, ("k", 20_000): 1}
    assert {ks.loads(k): orjson.loads(v) for k, v in out["per_2"].items()} == {("k", 0): 2, ("k", 2): 1}
