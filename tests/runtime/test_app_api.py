"""The decorator API on the real broker, with a worker running in this process."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

import streamkit
from assignors.murmur2 import kafka_partition
from streamkit import Tumbling
from streamkit.runtime.worker import Worker
from streamkit.testing import create_topic, produce_json, read_topic

BASE_MS = 1_767_225_600_000  # a minute boundary


def make_app(broker: str, tmp_path: Path, partitions: int = 2) -> tuple[streamkit.App, str]:
    tag = uuid.uuid4().hex[:8]
    topic = create_topic(broker, f"api-{tag}", partitions)
    app = streamkit.App(
        f"api-{tag}",
        broker=broker,
        state_dir=tmp_path,
        commit_interval=0.2,
        session_timeout_ms=4000,
        heartbeat_interval_ms=400,
    )
    return app, topic


async def produce_with_timestamps(broker: str, topic: str, records: list[tuple[str, Any, int]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=broker)
    await producer.start()
    try:
        for key, value, ts in records:
            await producer.send_and_wait(topic, orjson.dumps(value), key=key.encode(), timestamp_ms=ts)
    finally:
        await producer.stop()


async def run_until(worker: Worker, done: Callable[[], bool], timeout: float = 60.0) -> None:
    task = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(timeout):
            while not done():
                if task.done():
                    task.result()
                    raise AssertionError("worker stopped early")
                await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await task


def test_tumbling_window_async_handler_output_and_callbacks(broker: str, tmp_path: Path) -> None:
    app, topic_name = make_app(broker, tmp_path)
    source = app.topic(topic_name)
    out = app.topic(f"{topic_name}-out")
    create_topic(broker, out.name, 3)
    revenue = app.table("revenue", default=int, window=Tumbling(60))
    seen: list[int] = []
    assigned: list[list[Any]] = []
    revoked: list[list[Any]] = []
    windows: dict[tuple[str, int], int] = {}

    @app.processor(source)
    async def handle(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        await asyncio.sleep(0)  # async handlers may await
        revenue[key] += value["amount"]
        windows[(key, revenue.window_start(ctx.timestamp))] = revenue[key]
        ctx.send(out, key, {"total": revenue[key]})
        seen.append(ctx.offset)

    @app.on_keys_assigned
    def on_assigned(partitions: list[Any]) -> None:
        assigned.append(sorted(p.partition for p in partitions))

    @app.on_keys_revoked
    def on_revoked(partitions: list[Any]) -> None:
        revoked.append(sorted(p.partition for p in partitions))

    records = []
    expected: dict[tuple[str, int], int] = {}
    for i in range(300):
        key, ts = f"c{i % 5}", BASE_MS + i * 1_000  # 5 minutes of records
        records.append((key, {"amount": i}, ts))
        w = (key, ts - ts % 60_000)
        expected[w] = expected.get(w, 0) + i
    asyncio.run(produce_with_timestamps(broker, source.name, records))
    asyncio.run(run_until(Worker(app, 1), lambda: len(seen) == len(records)))
    assert windows == expected
    assert sorted(sum(assigned, [])) == [0, 1]  # one call per processor: p0 = 2
    assert sorted(sum(revoked, [])) == [0, 1]  # on the way out, before the last checkpoint
    output = read_topic(broker, out.name)
    assert len(output) == len(records)
    for rec in output:
        assert rec.partition == kafka_partition(rec.key, 3)  # linear hashing with n == n0
        src_topic, src_part, src_off = dict(rec.headers)["streamkit.source"].decode().rsplit("/", 2)
        assert src_topic == source.name and int(src_part) in (0, 1) and int(src_off) >= 0


def test_per_processor_timer_reads_its_tables_and_sends(broker: str, tmp_path: Path) -> None:
    app, topic_name = make_app(broker, tmp_path)
    source = app.topic(topic_name)
    counts = app.table("counts", default=int)
    report = app.topic(f"{topic_name}-report")
    create_topic(broker, report.name, 1)
    ticks: dict[int, dict[str, int]] = {}
    handled: list[int] = []

    @app.processor(source)
    def handle(key: str, value: Any, ctx: streamkit.Context) -> None:
        counts[key] += 1
        handled.append(1)

    @app.every(0.1)
    def snapshot(ctx: streamkit.Context) -> None:
        ticks[ctx.processor] = dict(counts.items())
        ctx.send(report, f"p{ctx.processor}", sum(ticks[ctx.processor].values()))

    produce_json(broker, source.name, [(f"k{i % 7}", {"i": i}) for i in range(70)])

    def all_counted() -> bool:
        return len(handled) == 70 and sum(sum(t.values()) for t in ticks.values()) == 70

    asyncio.run(run_until(Worker(app, 1), all_counted))
    merged: dict[str, int] = {}
    for t in ticks.values():
        assert not set(t) & set(merged), "a key is in two processors"
        merged.update(t)
    assert merged == {f"k{i}": 10 for i in range(7)}
    assert read_topic(broker, report.name)


def test_state_survives_a_clean_restart_of_the_worker(broker: str, tmp_path: Path) -> None:
    app, topic_name = make_app(broker, tmp_path)
    source = app.topic(topic_name)
    totals = app.table("totals", default=int)
    handled: list[int] = []

    @app.processor(source)
    def handle(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        totals[key] += value["n"]
        handled.append(1)

    produce_json(broker, source.name, [(f"k{i % 3}", {"n": 1}) for i in range(30)])
    asyncio.run(run_until(Worker(app, 1), lambda: len(handled) == 30))
    produce_json(broker, source.name, [(f"k{i % 3}", {"n": 1}) for i in range(30)])
    finals: dict[str, int] = {}

    @app.every(0.05)
    def peek(ctx: streamkit.Context) -> None:
        finals.update(dict(totals.items()))

    asyncio.run(run_until(Worker(app, 1), lambda: len(handled) == 60 and sum(finals.values()) == 60))
    assert finals == {"k0": 20, "k1": 20, "k2": 20}


def test_tables_outside_handlers_and_bad_declarations_fail_clearly() -> None:
    app = streamkit.App("decl-test", broker="127.0.0.1:1")
    t = app.table("t")
    with pytest.raises(RuntimeError, match="table 't' was used outside a handler"):
        t["x"]
    with pytest.raises(ValueError, match="table 't' is declared twice"):
        app.table("t")
    with pytest.raises(TypeError, match=r"must take \(key, value, ctx\)"):
        app.processor("in")(lambda key, value: None)
    with pytest.raises(TypeError, match="default must be a callable"):
        app.table("u", default=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Tumbling window size must be > 0"):
        Tumbling(0)
