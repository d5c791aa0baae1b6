"""The Spark backfill (replay) of an app that merges several topics in time order (a
table fed by a topic, a stream-stream join) and reads a global table equals a live
worker's stores.

A history of three topics (customer updates, orders, clicks), with out-of-order
timestamps within each topic and clicks late enough for the join to refuse some, goes
to Kafka; a real worker processes it, and the replay backfill builds stores from an
export of the same records (topic, partition, offset, timestamp). Which customer an
order sees, which order meets which click and which click is late all depend on the
order the topics' records are merged in: both sets of stores must hold the same bytes
in every table (the fed table's versions, the join's buffers and their books) and the
same stream time per processor."""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import orjson

import streamkit
from stores.rocksdb import RocksDBStore
from streamkit.spark import BackfillOptions, backfill_replay
from streamkit.testing import create_topic, produce_json, read_topic
from streamkit.windows import STREAM_TIME_KEY
from tests.runtime.jobs import Job, wait_for_log, wait_until_committed
from tests.spark.merged_app import make_app

PROCESSORS, CUSTOMERS, PRODUCTS, N = 2, 12, 20, 200
T0 = 1_700_000_000_000


def _history(rng: random.Random) -> dict[str, list[tuple[str, Any, None, int]]]:
    """Per topic, records over 10 minutes, each topic's shuffled by up to 9 s (the join's
    within plus grace is 6 s: some clicks are late)."""

    def side(prefix: str, value: Any) -> list[tuple[str, Any, None, int]]:
        stamps = sorted(T0 + rng.randrange(600_000) for _ in range(N))
        order = sorted(range(N), key=lambda i: stamps[i] + rng.randrange(9_000))
        return [(f"c{rng.randrange(CUSTOMERS)}", value(prefix, i), None, stamps[i]) for i in order]

    return {
        "customers": side("u", lambda p, i: {"level": i % 7}),
        "orders": side("o", lambda p, i: {"id": f"{p}{i}", "product": f"p{i % (PRODUCTS + 3)}"}),
        "clicks": side("k", lambda p, i: {"id": f"{p}{i}"}),
    }


def _stores(app: streamkit.App, app_dir: Path) -> dict[int, tuple[dict[str, dict[bytes, bytes]], int]]:
    """Per processor: every table's stored bytes and the stream time. The join's buckets
    past their retention at that stream time are left out: a worker deletes them at a
    checkpoint whose stream time entered a new bucket since its last, so a few may
    still be there when it stops; the backfill deletes them all."""
    out = {}
    tables = sorted(app.tables)
    for pid in range(PROCESSORS):
        with RocksDBStore.open(str(app_dir / f"processor-{pid}"), tables, create=False) as store:
            held = {t: dict(store.items(t)) for t in tables}
            stream_time = int(store.checkpoint().extra.get(STREAM_TIME_KEY, -1))
        buffer = app.tables["join-paired"]
        assert buffer.window is not None
        retention = buffer.window.size_ms + buffer.window.retention_ms
        held["join-paired"] = {
            k: v for k, v in held["join-paired"].items()
            if buffer.store_key_serde.loads(k)[1] + retention > stream_time
        }  # fmt: skip
        out[pid] = (held, stream_time)
    return out


def test_a_replay_of_three_merged_topics_equals_a_live_workers_stores(spark: Any, broker: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    topics = {kind: create_topic(broker, f"{kind}-{tag}", PROCESSORS) for kind in ("customers", "orders", "clicks")}
    history = _history(random.Random(5))
    for kind, records in history.items():
        produce_json(broker, topics[kind], records)
    topics["products"] = create_topic(broker, f"products-{tag}", 3)
    produce_json(broker, topics["products"], [(f"p{i}", {"price": 10 + i}) for i in range(PRODUCTS)])
    produce_json(broker, topics["products"], [("p3", {"price": 1000}), ("p4", None)])  # an update, a delete

    name = f"bf-merged-{tag}"
    job = Job(broker, name, topics["orders"], tmp_path / "live", processors=PROCESSORS,
              app_spec="tests.spark.merged_app:app")  # fmt: skip
    env = {"SK_TEST_CLICKS": topics["clicks"], "SK_TEST_CUSTOMERS": topics["customers"],
           "SK_TEST_PRODUCTS": topics["products"]}  # fmt: skip
    worker = job.start_worker(**env)
    try:
        wait_for_log(job, worker, "hosts processors")
        for kind in ("customers", "orders", "clicks"):
            wait_until_committed(job, PROCESSORS, N, topic=topics[kind])
    finally:
        job.stop_all()
    assert worker.returncode == 0, job.log(worker, 3000)

    rows = [
        (topic, r.key, r.value, r.partition, r.offset, r.timestamp)
        for topic in (topics["customers"], topics["orders"], topics["clicks"])
        for r in read_topic(broker, topic)
    ]  # fmt: skip
    assert len(rows) == 3 * N
    random.Random(1).shuffle(rows)  # the DataFrame's row order must not matter
    df = spark.createDataFrame(rows, "topic string, key binary, value binary, partition int, offset long, ts long")
    app = make_app(name, topics["orders"], topics["clicks"], topics["customers"], topics["products"])
    result = backfill_replay(
        app,
        df,
        BackfillOptions(
            topic_col="topic",
            key_encoded=True,
            value_encoded=True,
            partition_col="partition",
            offset_col="offset",
            state_dir=tmp_path / "backfill",
            p0=PROCESSORS,
            processors=PROCESSORS,
            broker=broker,
        ),
        timestamp_col="ts",
    )

    tables = sorted(app.tables)
    assert {"customers", "totals", "pairs", "join-paired"} <= set(tables)
    want, got = _stores(app, tmp_path / "live" / name), _stores(app, tmp_path / "backfill" / name)
    for pid in range(PROCESSORS):
        assert got[pid][1] == want[pid][1] > T0, f"processor {pid}: stream time"
        for t in tables:
            assert got[pid][0][t] == want[pid][0][t], f"processor {pid}, table {t}: the backfill differs"
    late = [r for r in read_topic(broker, f"{name}-dead-letters") if ("streamkit.error.reason", b"late") in r.headers]
    assert result.details["late"] == len(late) > 0  # the same clicks were late in both
    assert sum(len(held["pairs"]) for held, _ in want.values()) > 5
    totals = [orjson.loads(v) for held, _ in want.values() for v in held["totals"].values()]
    assert sum(t[0] for t in totals) == N and sum(t[2] for t in totals) > 1000  # p3's price, as updated
    assert result.rows_read == 3 * N
