"""The Spark backfill (replay) of windowed tables equals a live worker's stores.

One history, with out-of-order, late and gapped records for every kind of window
(``tests.windows.windows_app``'s tables: tumbling, hopping, session, sliding, count),
goes to Kafka; a real worker processes it, and the replay backfill builds stores from
an export of the same records (partitions, offsets, timestamps). Both sets of stores
must hold the same windows, the same books (which windows closed: the backfill records
as closed what the history's stream time closed, so a worker going on from its stores
does not send those closes again) and the same stream time per processor."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from assignors.linear_hashing import partition_for_key
from stores.rocksdb import RocksDBStore
from streamkit.layout.protocol import LayoutCoordinator
from streamkit.spark import BackfillOptions, backfill_replay
from streamkit.testing import create_topic, read_topic, unique_topic_name
from streamkit.windows import STREAM_TIME_KEY
from tests.runtime.jobs import committed
from tests.windows.test_windows_driver import history
from tests.windows.test_windows_worker import PARTITIONS, Worker, produce
from tests.windows.windows_app import make_all_app


def stores(app_dir: Path, tables: list[str], processors: int) -> dict[int, tuple[dict[str, dict[bytes, Any]], int]]:
    """Per processor: every table's entries (values decoded) and its stream time."""
    out = {}
    for pid in range(processors):
        with RocksDBStore.open(str(app_dir / f"processor-{pid}"), tables, create=False) as store:
            held = {t: {k: orjson.loads(v) for k, v in store.items(t)} for t in tables}
            out[pid] = (held, int(store.checkpoint().extra.get(STREAM_TIME_KEY, -1)))
    return out


async def produce_expanding(broker: str, topic: str, records: list[tuple[str, int, int]]) -> None:
    """The first half of ``records`` to a topic of two partitions, the second half once it
    has grown to four (linear hashing: half of each partition's keys move to a new one)."""
    async with LayoutCoordinator(broker, ack_timeout=5.0) as co:
        await co.create(topic, 2, capacity=4)
        await produce(broker, topic, records[: len(records) // 2], 2)
        await co.expand(topic, 4)
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all", linger_ms=5)
    await producer.start()
    try:
        for key, ts, n in records[len(records) // 2 :]:
            part = partition_for_key(key.encode(), 2, 4)
            await producer.send(topic, orjson.dumps({"n": n}), key=key.encode(), timestamp_ms=ts, partition=part)
        await producer.flush()
    finally:
        await producer.stop()


@pytest.mark.parametrize(
    ("partitions", "processors", "expanded"),
    [(PARTITIONS, PARTITIONS, False), (4, 1, False), (4, 3, False), (4, 1, True)],
)
def test_a_replay_backfill_of_every_kind_of_window_equals_a_live_workers_stores(
    spark: Any, broker: str, tmp_path: Path, partitions: int, processors: int, expanded: bool
) -> None:
    """One partition per processor, one processor reading all four, three processors each
    reading all four (sharing them: each its keys' records of each), or one processor
    reading a topic that grew from two partitions to four halfway; a processor's partitions
    merged by timestamp live, each record's stream time its partition's in the replay.
    Grown: a rebuild from the input and a restore from the changelog hold the live
    stores too."""
    records = history(77, n=700, keys=10)
    topic, name = unique_topic_name("bfwin"), unique_topic_name("bfwinapp")
    if expanded:
        asyncio.run(produce_expanding(broker, topic, records))
    else:
        create_topic(broker, topic, partitions=partitions)
        asyncio.run(produce(broker, topic, records, partitions))

    live = Worker(broker, tmp_path / "live", name, topic)
    live.env["STREAMKIT_PROCESSORS"] = str(processors)
    (tmp_path / "live").mkdir()
    live.start()
    live.wait_for("hosts processors")
    deadline = time.monotonic() + 90
    while sum(committed(broker, f"streamkit-{name}", topic, partitions).values()) < len(records):
        assert time.monotonic() < deadline, live.log()[-3000:]
        time.sleep(0.2)
    assert live.stop() == 0, live.log()[-3000:]

    exported = [(r.key, r.value, r.partition, r.offset, r.timestamp) for r in read_topic(broker, topic)]
    assert len(exported) == len(records)
    df = spark.createDataFrame(exported, "key binary, value binary, partition int, offset long, ts long")
    app = make_all_app(name, topic, processors=processors)
    result = backfill_replay(
        app,
        df,
        BackfillOptions(
            topic_partitions={topic: (2, 4)} if expanded else None,
            key_encoded=True,
            value_encoded=True,
            partition_col="partition",
            offset_col="offset",
            state_dir=tmp_path / "backfill",
            processors=processors,
        ),
        timestamp_col="ts",
    )

    tables = sorted(app.tables)
    assert any(t.endswith("__windows") for t in tables)
    want = stores(tmp_path / "live" / "state" / name, tables, processors)
    got = stores(tmp_path / "backfill" / name, tables, processors)
    for pid in range(processors):
        assert got[pid][1] == want[pid][1] > 0, f"processor {pid}: stream time"
        for t in tables:
            assert got[pid][0][t] == want[pid][0][t], f"processor {pid}, table {t}: the backfill differs"
    assert len(read_topic(broker, f"{name}-closes-late")) > 50  # late decisions were made (the same ones)
    assert result.details["late"] == 0  # (the app handles its late records itself)
    assert sum(len(held[t]) for held, _ in want.values() for t in tables) > 100
    if not expanded:
        return

    late = len(read_topic(broker, f"{name}-closes-late"))
    for how, changelog in (("rebuilt from", "false"), ("restored from the changelog", "true")):
        for pid in range(processors):
            shutil.rmtree(tmp_path / "live" / "state" / name / f"processor-{pid}")
        live.env["STREAMKIT_CHANGELOG"] = changelog
        live.start()
        live.wait_for("hosts processors")
        assert how in live.log(), live.log()[-3000:]
        assert live.stop() == 0, live.log()[-3000:]
        again = stores(tmp_path / "live" / "state" / name, tables, processors)
        for pid in range(processors):
            assert again[pid][1] == want[pid][1], f"processor {pid}: stream time once {how}"
            for t in tables:
                assert again[pid][0][t] == want[pid][0][t], f"processor {pid}, table {t}: differs once {how}"
        assert len(read_topic(broker, f"{name}-closes-late")) == late, f"late records reported again once {how}"
