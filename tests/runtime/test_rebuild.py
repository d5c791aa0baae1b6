"""A processor started without its store rebuilds it from the input, without output.

Real broker, real RocksDB, a worker in this process: the first worker uses one state
directory, the second another (what happens on another machine).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

import streamkit
from stores.rocksdb import RocksDBStore
from streamkit.kafkaio import KafkaIO
from streamkit.layout.protocol import LayoutCoordinator
from streamkit.producer import Producer
from streamkit.runtime.worker import Worker
from streamkit.testing import create_topic, produce_json, read_topic
from tests.runtime.test_app_api import run_until


def make_app(broker: str, name: str, topic: str, state_dir: Path, out: str, ticks: str) -> tuple[Any, dict[str, Any]]:
    app = streamkit.App(
        name,
        broker=broker,
        state_dir=state_dir,
        processors=2,
        commit_interval=0.2,
        session_timeout_ms=4000,
        heartbeat_interval_ms=400,
        max_partition_fetch_bytes=4096,  # small batches: timers get the chance to run between them
        changelog=False,  # the rebuild from the input: a job without a changelog (one with restores: tests/state)
    )
    counts = app.table("counts", default=int)
    seen: dict[str, Any] = {"handled": [], "phase": ""}

    @app.processor(app.topic(topic))
    def count(key: str, value: Any, ctx: streamkit.Context) -> None:
        counts[key] += 1
        seen["handled"].append((ctx.partition, ctx.offset))
        ctx.send(out, key, {"count": counts[key]})

    @app.every(0.02)
    def tick(ctx: streamkit.Context) -> None:
        ctx.send(ticks, str(ctx.processor), {"phase": seen["phase"], "total": sum(v for _, v in counts.items())})

    return app, seen


def stored_counts(state_dir: Path, app: str, processors: int = 2) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {}
    for pid in range(processors):
        with RocksDBStore.open(str(state_dir / app / f"processor-{pid}"), ["counts"]) as store:
            out[pid] = {k.decode(): orjson.loads(v) for k, v in store.items("counts")}
    return out


def test_a_worker_on_another_machine_rebuilds_without_output_or_timers(broker: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    topic = create_topic(broker, f"rb-{tag}", 2)
    out, ticks = create_topic(broker, f"rb-out-{tag}", 1), create_topic(broker, f"rb-ticks-{tag}", 1)
    name = f"rb-{tag}"
    first = [(f"k{i % 50}", {"i": i}) for i in range(4000)]
    produce_json(broker, topic, first)
    app, seen = make_app(broker, name, topic, tmp_path / "machine-a", out, ticks)
    seen["phase"] = "a"
    asyncio.run(run_until(Worker(app, 1), lambda: len(seen["handled"]) == len(first), timeout=90))
    totals_a = stored_counts(tmp_path / "machine-a", name)

    later = [(f"k{i % 50}", {"i": i}) for i in range(4000, 4500)]
    produce_json(broker, topic, later)
    app_b, seen_b = make_app(broker, name, topic, tmp_path / "machine-b", out, ticks)
    seen_b["phase"] = "b"
    # every record once through the rebuild, then the 500 new ones with output
    asyncio.run(run_until(Worker(app_b, 1), lambda: len(seen_b["handled"]) == len(first) + len(later), timeout=90))

    expected = Counter(k for k, _ in first + later)
    rebuilt = stored_counts(tmp_path / "machine-b", name)
    assert {k: v for pid in rebuilt for k, v in rebuilt[pid].items()} == dict(expected)
    # one output per input record: the rebuild sent nothing again
    sources = Counter(dict(r.headers)["streamkit.source"].decode() for r in read_topic(broker, out))
    assert len(sources) == len(first) + len(later) and set(sources.values()) == {1}
    # no timer of the second worker ever saw a processor's state short of what the first one had
    for rec in read_topic(broker, ticks):
        tick = orjson.loads(rec.value)
        if tick["phase"] == "b":
            pid = int(rec.key)
            assert tick["total"] >= sum(totals_a[pid].values()), f"timer fired on a partial rebuild: {tick}"


def test_a_rebuild_after_a_shrink_reads_the_drained_partitions(broker: str, tmp_path: Path) -> None:
    """2 -> 4 partitions, 400 records, shrink to 2, 100 more, drain given up: a fresh
    worker's stores hold all 500 (the drained partitions are read, in key order)."""
    tag = uuid.uuid4().hex[:8]
    topic, name = f"rbs-{tag}", f"rbs-{tag}"
    out, ticks = create_topic(broker, f"rbs-out-{tag}", 1), create_topic(broker, f"rbs-ticks-{tag}", 1)
    group = f"streamkit-{name}"

    async def produce(n: int, start: int) -> None:
        async with Producer(broker, client_id=f"rbs-{tag}") as p:
            for i in range(start, start + n):
                await p.send(topic, f"k{i % 40}", {"i": i})
            await p.flush()

    async def wait_consumed(worker_task: asyncio.Task[None], partitions: list[int]) -> None:
        deadline = time.monotonic() + 60
        async with KafkaIO(broker) as io:
            while True:
                committed = await io.committed(group, topic, partitions)
                hws = await io.high_watermarks(topic, partitions)
                if all(committed.get(p, 0) >= hws[p] for p in partitions):
                    return
                assert not worker_task.done(), "the worker stopped"
                assert time.monotonic() < deadline, f"not consumed: {committed} of {hws}"
                await asyncio.sleep(0.1)

    async def first_machine() -> None:
        async with LayoutCoordinator(broker) as co:
            await co.create(topic, 2, capacity=4)
            app, _ = make_app(broker, name, topic, tmp_path / "machine-a", out, ticks)
            worker = Worker(app, 1)
            task = asyncio.create_task(worker.run())
            try:
                await co.expand(topic, 4)
                await produce(400, 0)
                await wait_consumed(task, [0, 1, 2, 3])
                await co.shrink(topic, 2, delay=0)
                await produce(100, 400)
                await wait_consumed(task, [0, 1, 2, 3])
                _, given_up, kept = await co.finish_drain(topic, groups=[group])
                assert given_up == (2, 3), kept
            finally:
                worker.stop()
                await task

    asyncio.run(first_machine())
    expected = Counter(f"k{i % 40}" for i in range(500))
    original = stored_counts(tmp_path / "machine-a", name)
    assert sum(sum(c.values()) for c in original.values()) == 500

    app_b, _ = make_app(broker, name, topic, tmp_path / "machine-b", out, ticks)
    worker_b = Worker(app_b, 1)
    asyncio.run(
        run_until(worker_b, lambda: bool(worker_b.members) and len(worker_b.members[0].serving()) == 2, timeout=90)
    )
    rebuilt = stored_counts(tmp_path / "machine-b", name)
    assert {k: v for pid in rebuilt for k, v in rebuilt[pid].items()} == dict(expected)
    assert rebuilt == original


def test_a_rebuild_applies_a_plain_topics_stray_forwarded_twice_once(broker: str, tmp_path: Path) -> None:
    """A plain topic written by librdkafka's partitioner (CRC32): its strays are forwarded
    to where murmur2 places their keys. A sweep killed before its checkpoint forwards some
    again, so one origin can have two copies in its target partition. Live admission drops
    the second; a rebuild from the input (a lost store, a shrink's staging store) must too."""
    from streamkit.layout.strays import STRAY_HEADER
    from streamkit.testing import default_partition, produce_json
    from tests.runtime.plain_producers import produce_plain

    tag = uuid.uuid4().hex[:8]
    topic = create_topic(broker, f"rbp-{tag}", 2)
    out, ticks = create_topic(broker, f"rbp-out-{tag}", 1), create_topic(broker, f"rbp-ticks-{tag}", 1)
    name = f"rbp-{tag}"
    records = [(f"k{i % 60}", {"i": i}) for i in range(600)]
    produce_plain("confluent", broker, topic, records)
    app, seen = make_app(broker, name, topic, tmp_path / "machine-a", out, ticks)
    asyncio.run(run_until(Worker(app, 1), lambda: len(seen["handled"]) == len(records), timeout=90))

    copies = [r for r in read_topic(broker, topic) if any(h == STRAY_HEADER for h, _ in r.headers or ())]
    assert copies, "CRC32 and murmur2 disagree on some of 60 keys: strays were forwarded"
    twice = copies[0]  # forwarded again, as by a sweep killed before its checkpoint
    again = (twice.key, twice.value, twice.partition)
    produce_json(broker, topic, [again], headers=list(twice.headers))
    last = ("k0", {"i": len(records)})
    produce_json(broker, topic, [last])  # read past the second copy
    app_a, seen_a = make_app(broker, name, topic, tmp_path / "machine-a", out, ticks)
    asyncio.run(run_until(Worker(app_a, 1), lambda: len(seen_a["handled"]) == 1, timeout=90))

    expected = Counter(k for k, _ in [*records, last])
    live = stored_counts(tmp_path / "machine-a", name)
    assert {k: v for pid in live for k, v in live[pid].items()} == dict(expected)
    # another machine rebuilds both stores from the input: both copies lie below the group's positions
    more = ("k1", {"i": len(records) + 1})
    produce_json(broker, topic, [more])
    part = default_partition(b"k1", 2)
    end = max(r.offset for r in read_topic(broker, topic) if r.partition == part)
    app_b, seen_b = make_app(broker, name, topic, tmp_path / "machine-b", out, ticks)
    asyncio.run(run_until(Worker(app_b, 1), lambda: (part, end) in seen_b["handled"], timeout=90))

    expected[more[0]] += 1
    rebuilt = stored_counts(tmp_path / "machine-b", name)
    assert {k: v for pid in rebuilt for k, v in rebuilt[pid].items()} == dict(expected)
