"""Acceptance: backfill from Parquet (both modes) + the tail in Kafka == the whole stream from Kafka.

History is the first ~70% of each partition of a real topic on the real broker, written
as Parquet with partition, offset and timestamp; the topic holds the whole stream.
A reference job processes the whole topic from Kafka alone. Each backfilled job gets
its stores from the Parquet, then real worker processes consume from the stamped
positions: the tail only. Final state must equal the reference for every key.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from stores.rocksdb import RocksDBStore
from streamkit.errors import ConfigError
from streamkit.spark import BackfillOptions, InjectedFailure, backfill_replay, backfill_table
from streamkit.state.changelog import CHANGELOG_POSITION, MARKER_PREFIX, Marker, changelog_topic
from streamkit.testing import create_topic, produce_json, read_topic

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 6
N = 20_000
KEYS = 500
HISTORY = 0.7

sys.path.insert(0, str(Path(__file__).parent))
from e2e_app import make_app  # noqa: E402


class Workers:
    def __init__(self, bootstrap: str, topic: str, state_dir: Path) -> None:
        self.bootstrap, self.topic, self.state_dir = bootstrap, topic, state_dir

    def run_until_caught_up(self, app: str, total: int, timeout: float = 90.0) -> None:
        env = dict(os.environ)
        env.update(
            SK_BF_APP=app,
            SK_BF_TOPIC=self.topic,
            STREAMKIT_BROKER=self.bootstrap,
            STREAMKIT_STATE_DIR=str(self.state_dir),
            STREAMKIT_SESSION_TIMEOUT_MS="4000",
            STREAMKIT_HEARTBEAT_INTERVAL_MS="400",
            PYTHONPATH=str(ROOT),
        )
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamkit.cli",
                "worker",
                "tests.spark.e2e_app:app",
                "--log-level",
                os.environ.get("SK_BF_LOG", "WARNING"),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=None if os.environ.get("SK_BF_LOG") else subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + timeout
            while (
                sum(committed(self.bootstrap, f"streamkit-{app}", self.topic).values()) < total
                or self.stored_positions(app) < total
            ):
                if proc.poll() is not None:
                    raise AssertionError(f"worker exited {proc.returncode}: {proc.stderr.read().decode()[-3000:]}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"{app} did not catch up in {timeout}s")
                if os.environ.get("SK_BF_LOG"):
                    print(
                        "wait",
                        committed(self.bootstrap, f"streamkit-{app}", self.topic),
                        self.stored_positions(app),
                        file=sys.stderr,
                    )
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stored_positions(self, app: str) -> int:
        """Sum of the stores' checkpoint positions, read while the worker holds them."""
        from rocksdict import AccessType, Rdict

        from stores.base import Checkpoint
        from stores.rocksdb import CHECKPOINT_KEY, store_options

        best: dict[int, int] = {}
        for pid in range(3):
            path = self.state_dir / app / f"processor-{pid}"
            if not (path / "CURRENT").exists():
                return 0
            db = Rdict(str(path), store_options(), access_type=AccessType.read_only())
            try:
                data = db.get(CHECKPOINT_KEY)
            finally:
                db.close()
            if data is not None:
                for (t, q), o in Checkpoint.from_bytes(data).positions.items():
                    if t == self.topic:
                        best[q] = max(best.get(q, 0), o)
        return sum(best.values())

    def state(self, app: str) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for pid in range(3):
            store = RocksDBStore.open(str(self.state_dir / app / f"processor-{pid}"), ["stats"], create=False)
            try:
                for k, v in store.items("stats"):
                    assert k.decode() not in out, f"key {k!r} in two stores"
                    out[k.decode()] = orjson.loads(v)
            finally:
                store.close()
        return out

    def raw(self, app: str) -> dict[int, tuple[dict[bytes, bytes], Any]]:
        out = {}
        for pid in range(3):
            store = RocksDBStore.open(str(self.state_dir / app / f"processor-{pid}"), ["stats"], create=False)
            try:
                out[pid] = (dict(store.items("stats")), store.checkpoint())
            finally:
                store.close()
        return out


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    import asyncio

    async def run() -> dict[int, int]:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        await c.start()
        try:
            return {p: (await c.committed(TopicPartition(topic, p))) or 0 for p in range(PARTITIONS)}
        finally:
            await c.stop()

    return asyncio.run(run())


def pure_reference(records: list[Any]) -> dict[str, dict[str, Any]]:
    ref: dict[str, dict[str, Any]] = {}
    for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
        v = orjson.loads(rec.value)
        s = ref.setdefault(rec.key.decode(), {"n": 0, "sum": 0, "last": -1, "disorder": 0})
        s["disorder"] += 1 if v["seq"] <= s["last"] else 0
        s["n"] += 1
        s["sum"] += v["amount"]
        s["last"] = v["seq"]
    return ref


def test_backfill_then_tail_from_kafka_equals_whole_stream_from_kafka(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    import pyspark.sql.functions as F

    tag = uuid.uuid4().hex[:8]
    topic = create_topic(bootstrap, f"bf-in-{tag}", PARTITIONS)
    records = [(f"k{(i * 7919) % KEYS}", {"amount": i % 97, "seq": i}) for i in range(N)]
    produce_json(bootstrap, topic, records)
    stream = read_topic(bootstrap, topic)
    assert len(stream) == N
    per_part = {p: sum(1 for r in stream if r.partition == p) for p in range(PARTITIONS)}
    cut = {p: int(n * HISTORY) for p, n in per_part.items()}
    history = [r for r in stream if r.offset < cut[r.partition]]
    assert 0 < len(history) < N
    parquet = tmp_path / "history.parquet"
    pq.write_table(
        pa.table(
            {
                "key": [r.key.decode() for r in history],
                "amount": [orjson.loads(r.value)["amount"] for r in history],
                "seq": [orjson.loads(r.value)["seq"] for r in history],
                "partition": [r.partition for r in history],
                "offset": [r.offset for r in history],
                "timestamp": [r.timestamp for r in history],
            }
        ),
        parquet,
    )
    workers = Workers(bootstrap, topic, tmp_path / "state")

    # The reference: the whole stream, from Kafka alone.
    workers.run_until_caught_up(f"ref-{tag}", N)
    reference = workers.state(f"ref-{tag}")
    assert reference == pure_reference(stream)

    hist = spark.read.parquet(str(parquet))

    # Mode 1: final state computed by Spark from the Parquet, then the tail from Kafka.
    a1 = make_app(f"bf1-{tag}", topic)
    final = hist.groupBy("key").agg(
        F.struct(
            F.count("*").alias("n"),
            F.sum("amount").alias("sum"),
            F.max_by("seq", "offset").alias("last"),
            F.lit(0).alias("disorder"),
        ).alias("value"),
        F.max("offset").alias("offset"),
        F.first("partition").alias("partition"),
    )
    r1 = backfill_table(
        a1,
        "stats",
        final,
        BackfillOptions(offset_col="offset", partition_col="partition", broker=bootstrap, state_dir=workers.state_dir),
    )
    # p0 is now recorded for the job: a backfill for another p0 is refused before any work
    with pytest.raises(ConfigError, match="created with 3 processors"):
        backfill_table(
            a1,
            "stats",
            final,
            BackfillOptions(
                offset_col="offset", partition_col="partition", p0=2, broker=bootstrap, state_dir=workers.state_dir
            ),
        )
    assert r1.positions == {(topic, p): c for p, c in cut.items()}
    logged = {}
    for pid, (_, cp) in workers.raw(a1.name).items():  # each store: the partitions it reads
        assert cp.positions == {(topic, q): c for q, c in cut.items() if q % 3 == pid}
        logged[pid] = cp.extra[CHANGELOG_POSITION]  # in the changelog before any worker serves it
    # the disk is lost before any worker ran: each processor is restored from the backfill's
    # snapshot in the changelog (the workers' first markers build on it), then the tail
    shutil.rmtree(workers.state_dir / a1.name)
    workers.run_until_caught_up(a1.name, N)
    assert workers.state(a1.name) == reference
    for pid, position in logged.items():
        markers = [
            Marker.decode(r.value)
            for r in read_topic(bootstrap, changelog_topic(a1.name))
            if r.partition == pid and r.key.startswith(MARKER_PREFIX)
        ]
        snapshot = next(m for m in markers if m.base is None)
        assert snapshot.checkpoint.positions == {(topic, q): c for q, c in cut.items() if q % 3 == pid}
        assert any(m.base == position for m in markers), (pid, position, [m.base for m in markers])

    # A backfill that fails midway leaves the live (now caught-up) stores untouched.
    live = workers.raw(a1.name)
    with pytest.raises(InjectedFailure):
        backfill_table(
            a1,
            "stats",
            final,
            BackfillOptions(
                offset_col="offset", partition_col="partition", state_dir=workers.state_dir, fail_at="publish"
            ),
        )
    assert workers.raw(a1.name) == live

    # Mode 2: the app's own handler replayed over the Parquet records, then the tail.
    a2 = make_app(f"bf2-{tag}", topic)
    replay_opts = BackfillOptions(
        value_col=["amount", "seq"],
        partition_col="partition",
        offset_col="offset",
        topic_partitions={topic: PARTITIONS},
        state_dir=workers.state_dir,
    )
    r2 = backfill_replay(a2, hist, replay_opts, timestamp_col="timestamp")
    assert r2.rows_read == len(history) and r2.positions == r1.positions
    backfilled = workers.raw(a2.name)
    workers.run_until_caught_up(a2.name, N)
    assert workers.state(a2.name) == reference

    # Re-running the backfill gives the same stores; processors restarted on them rebuild
    # the tail (already committed by the group) without output and end exactly equal again.
    backfill_replay(a2, hist, replay_opts, timestamp_col="timestamp")
    assert workers.raw(a2.name) == backfilled
    workers.run_until_caught_up(a2.name, N)
    assert workers.state(a2.name) == reference
