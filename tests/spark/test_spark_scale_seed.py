"""A Spark backfill seeds the processors a running job does not have yet; `streamkit
scale` then bootstraps them from the backfill's positions (T2) rather than from the
beginning of their history.

Real broker, real local Spark, real worker processes (tests/runtime/scale_app.py): the
job runs on 2 processors, the history so far is backfilled for 4 (only processors 2 and
3 are built: the running ones' stores are held), more records arrive, the job scales
2 -> 4 while a producer writes, and the end state equals the whole stream applied once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from stores.rocksdb import RocksDBStore
from streamkit.kafkaio import KafkaIO
from streamkit.spark import BackfillOptions, backfill_replay
from streamkit.testing import create_topic, produce_json, read_topic
from tests.runtime.scale_job import KEYS, ScaleJob

HISTORY = 4000


def test_a_backfill_seeds_new_processors_and_scale_bootstraps_them_from_its_positions(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    job = ScaleJob(bootstrap, tmp_path)
    create_topic(bootstrap, job.topic, 4)
    create_topic(bootstrap, job.out, 2)
    # the history: what a producer "h" sent before the job's processors scale
    produce_json(bootstrap, job.topic, [(f"k{i % KEYS}", {"p": "h", "seq": i}) for i in range(HISTORY)])
    state = tmp_path / "state" / job.app
    scale: list[Any] = []
    reports: list[dict[str, Any]] = []

    async def scenario() -> None:
        async with KafkaIO(bootstrap) as io:
            for _ in range(2):
                job.start_worker()
            await job.wait_consumed(io)
            history = await asyncio.to_thread(read_topic, bootstrap, job.topic)
            df = spark.createDataFrame(
                [
                    (r.key.decode(), "h", orjson.loads(r.value)["seq"], r.partition, r.offset, r.timestamp)
                    for r in history
                ],
                "key string, p string, seq long, partition int, offset long, ts long",
            )
            options = BackfillOptions(
                value_col=["p", "seq"], partition_col="partition", offset_col="offset",
                topic_partitions={job.topic: 4}, processors=4, broker=bootstrap, state_dir=tmp_path / "state",
            )  # fmt: skip
            result = await asyncio.to_thread(backfill_replay, job.app_object(), df, options, timestamp_col="ts")
            assert result.stores_published == 2, result
            assert sorted(p.name for p in state.glob("processor-*")) == [f"processor-{i}" for i in range(4)]
            seeded = {pid: _positions(state / f"processor-{pid}") for pid in (2, 3)}
            assert all(sum(s.values()) > 0 for s in seeded.values()), seeded
            job.start_producer()
            await job.wait_growth(io, 600)
            scale.append(await asyncio.to_thread(job.scale, "--processors", "4"))
            reports.extend(await job.finish(io))
            job.stop_workers()
            # the bootstraps started from the backfill's positions
            starts = {
                int(line.split("processor ", 1)[1].split()[0]): int(line.rsplit("T2 = ", 1)[1].split()[0])
                for line in job.logs().splitlines()
                if "joins the job" in line
            }
            assert starts == {pid: sum(s.values()) for pid, s in seeded.items()}, (starts, seeded)

    try:
        asyncio.run(scenario())
    finally:
        job.cleanup()
    assert scale[0].returncode == 0, scale[0].stdout + scale[0].stderr
    job.verify([{"sent": HISTORY}, *reports], 4, counts=(2, 3, 4), producers=["h", "p0"])


def _positions(path: Path) -> dict[tuple[str, int], int]:
    with RocksDBStore.open(str(path), []) as store:
        return dict(store.checkpoint().positions)
