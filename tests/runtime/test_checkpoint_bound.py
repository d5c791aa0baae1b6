"""A checkpoint starts as soon as a member's processors have changed ``checkpoint_dirty_keys`` keys,
whatever the timer and the record count say, so that no checkpoint writes (and pauses
for) more than that; the state stays exact."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import streamkit
from stores.rocksdb import RocksDBStore
from streamkit.kafkaio import KafkaIO
from streamkit.runtime.worker import Worker
from streamkit.testing import create_topic, produce_json

HANG_GUARD_S = 60


def test_many_changed_keys_start_a_checkpoint(broker: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    topic = create_topic(broker, f"bound-{tag}", 1)
    produce_json(broker, topic, [(f"k{i}", {"n": i}) for i in range(1000)])
    app = streamkit.App(
        f"bound-{tag}",
        broker=broker,
        state_dir=tmp_path,
        commit_interval=3600,  # neither the timer
        commit_every=1_000_000,  # nor the record count starts one here
        checkpoint_dirty_keys=100,
        session_timeout_ms=4000,
        heartbeat_interval_ms=400,
    )
    totals = app.table("totals", default=int)
    handled: list[int] = []

    @app.processor(app.topic(topic))
    def handle(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        totals[key] += value["n"]
        handled.append(ctx.offset)

    async def committed(io: KafkaIO) -> int:
        return (await io.committed(app.group_id, topic, [0])).get(0) or -1

    async def scenario() -> int:
        worker = Worker(app, 1)
        task = asyncio.create_task(worker.run())
        deadline = time.monotonic() + HANG_GUARD_S
        seen = -1
        try:
            async with KafkaIO(broker) as io:
                # the last checkpoint was at most 100 changed keys before the 1000th record
                while len(handled) < 1000 or (seen := await committed(io)) < 900:
                    assert not task.done(), "the worker stopped early"
                    assert time.monotonic() < deadline, f"handled {len(handled)}, committed {seen}"
                    await asyncio.sleep(0.05)
        finally:
            worker.stop()
            await task
        return seen

    assert asyncio.run(scenario()) >= 900
    store = RocksDBStore.open(str(app.store_path(0, tmp_path)), ["totals"])
    try:
        assert len(list(store.items("totals"))) == 1000
    finally:
        store.close()
