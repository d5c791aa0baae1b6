"""Windows close and expire on stream time: a record for a closed window is a dead
letter with reason `late`, and windows past their retention are deleted at checkpoints
(a real worker, the real broker, the store read back)."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

import orjson
import pytest
from test_app_api import BASE_MS, make_app, produce_with_timestamps, run_until

import streamkit
from stores.rocksdb import RocksDBStore
from streamkit import Tumbling
from streamkit.runtime.worker import Worker
from streamkit.testing import read_topic

MINUTE = 60_000


def test_window_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="retention .* must be at least its grace"):
        Tumbling(60, grace=30, retention=10)
    with pytest.raises(ValueError, match="grace must be >= 0"):
        Tumbling(60, grace=-1)
    w = Tumbling(60, grace=10, retention=120)
    assert not w.closed(0, 69_999) and w.closed(0, 70_000)
    assert not w.expired(0, 179_999) and w.expired(0, 180_000)


def test_late_records_are_dead_letters_and_expired_windows_are_deleted(broker: str, tmp_path: Path) -> None:
    app, topic = make_app(broker, tmp_path, partitions=1)
    source = app.topic(topic)
    per_minute = app.table("per_minute", default=int, window=Tumbling(60, grace=10, retention=120))
    handled: list[int] = []

    @app.processor(source)
    def count(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        handled.append(ctx.offset)
        per_minute[key] += value["n"]

    at = lambda minute, second=0: BASE_MS + minute * MINUTE + second * 1000  # noqa: E731
    records = [
        ("a", {"n": 1}, at(0, 5)),  # window 0
        ("a", {"n": 2}, at(1, 5)),  # window 1
        ("a", {"n": 4}, at(1, 5)),
        ("a", {"n": 8}, at(2, 5)),  # stream time 2:05: window 0 closed at 1:10, open until then
        ("a", {"n": 16}, at(0, 50)),  # late: window 0 (closed since 1:10)
        ("a", {"n": 32}, at(2, 8)),  # window 1 closes at 2:10: still open at 2:08
        ("a", {"n": 64}, at(1, 30)),  # ... so this one is not late
        ("a", {"n": 128}, at(5, 0)),  # stream time 5:00: windows 0..1 expired (end + 2 min)
    ]
    asyncio.run(produce_with_timestamps(broker, topic, records))
    asyncio.run(run_until(Worker(app, 1), lambda: len(handled) == len(records)))

    dead = read_topic(broker, app.dead_letter_topic)
    assert [dict(r.headers)["streamkit.error.reason"] for r in dead] == [b"late"]
    assert orjson.loads(dead[0].value) == {"n": 16}
    store = RocksDBStore.open(str(app.store_path(0)), ["per_minute"], create=False)
    try:
        windows = {struct.unpack(">q", k[-8:])[0] - BASE_MS: orjson.loads(v) for k, v in store.items("per_minute")}
        stream_time = store.checkpoint().extra["stream_time"]
    finally:
        store.close()
    # window 2 (2:00-3:00) ends at 3:00 + 2 min retention = 5:00: expired too; window 5 stays
    assert windows == {5 * MINUTE: 128}
    assert stream_time == at(5, 0)


def test_key_concurrent_handlers_see_their_own_records_time(broker: str, tmp_path: Path) -> None:
    """Handlers of different keys run at once: each windowed write goes to the window of
    its own record, not of whichever record the member read last."""
    app, topic = make_app(broker, tmp_path, partitions=1)
    source = app.topic(topic)
    # the records' times are shuffled over 4 minutes: a grace keeps every minute open
    per_minute = app.table("per_minute", default=int, window=Tumbling(60, grace=300))
    handled: list[int] = []

    @app.processor(source, concurrency=8)
    async def count(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        await asyncio.sleep(0.001 * (value["n"] % 3))  # finish out of order
        per_minute[key] += value["n"]
        handled.append(ctx.offset)

    records, expected = [], {}
    for i in range(240):
        key, ts = f"k{i % 6}", BASE_MS + (i * 7919 % 240) * 1000  # 4 minutes, shuffled
        records.append((key, {"n": i}, ts))
        w = (key.encode(), ts - ts % MINUTE)
        expected[w] = expected.get(w, 0) + i
    asyncio.run(produce_with_timestamps(broker, topic, records))
    asyncio.run(run_until(Worker(app, 1), lambda: len(handled) == len(records)))
    store = RocksDBStore.open(str(app.store_path(0)), ["per_minute"], create=False)
    try:
        got = {(k[:-8], struct.unpack(">q", k[-8:])[0]): orjson.loads(v) for k, v in store.items("per_minute")}
    finally:
        store.close()
    assert got == expected
