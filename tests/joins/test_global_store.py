"""A global table's store against the real broker: read in chunks, its positions kept,
a topic deleted (one line) or recreated under the same name (read again), and one whose
partition count changed (refused: one line)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

import streamkit
from streamkit.joins import global_store
from streamkit.joins.global_store import GlobalStores, GlobalTableError
from streamkit.kafkaio import KafkaIO
from streamkit.testing import aproduce_json


def test_a_store_reads_in_chunks_keeps_its_positions_and_follows_a_recreated_topic(
    broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(global_store, "READ_CHUNK", 7)  # many store batches, each with its positions
    topic = f"ref-{uuid.uuid4().hex[:8]}"
    app = streamkit.App("store-test")
    table = app.global_table("ref", source=topic)

    async def scenario() -> None:
        async with KafkaIO(broker) as io:
            await io.create_topic(topic, 2)
            await aproduce_json(broker, topic, [(f"k{i}", {"v": i}) for i in range(100)])
            stores = GlobalStores([table], tmp_path)
            try:
                await stores.catch_up(io)
                assert len(table) == 100 and table["k42"] == {"v": 42} and table.get(None, "none") == "none"
                held = dict(stores.stores[0].positions)
                assert sum(held.values()) == 100
            finally:
                stores.close()
            again = GlobalStores([table], tmp_path)  # a restart: nothing to read again
            try:
                assert await again.stores[0].read_on(io) == 0 and len(table) == 100
                admin = AIOKafkaAdminClient(bootstrap_servers=broker)
                await admin.start()
                try:
                    await admin.delete_topics([topic])
                    with pytest.raises(GlobalTableError, match="global table 'ref': its topic .* does not exist"):
                        await again.stores[0].read_on(io)
                    await io.create_topic(topic, 2)
                    await aproduce_json(broker, topic, [("fresh", {"v": 1})])
                    assert await again.stores[0].read_on(io) == 1
                    assert len(table) == 1 and table.get("k42") is None and table["fresh"] == {"v": 1}
                    # a third partition (the test broker cannot add one: its answers say so instead)
                    real = io.high_watermarks

                    async def three(t: str, parts: object) -> dict[int, int]:
                        return {**(await real(t, range(2))), 2: 0}

                    monkeypatch.setattr(io, "partition_count", lambda t, **kw: asyncio.sleep(0, 3))
                    monkeypatch.setattr(io, "high_watermarks", three)
                    with pytest.raises(GlobalTableError, match="went from 2 to 3 partitions"):
                        await again.stores[0].read_on(io)
                finally:
                    await admin.close()
            finally:
                again.close()

    asyncio.run(scenario())
