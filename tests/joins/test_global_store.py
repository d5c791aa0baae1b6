"""A global table's store against the real broker: read in chunks, its positions kept,
a topic deleted (one line) or recreated under the same name (read again), one whose
partition count changed (refused: one line), and records the topic deleted before the
store read them (counted, and one line naming the partition and the offsets)."""

from __future__ import annotations

import asyncio
import logging
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


def test_records_the_topic_deleted_before_the_store_read_them_are_counted_and_said(
    broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The log start offset is simulated: the test broker has no retention, and it closes
    the connection on DeleteRecords (which it lists among its APIs)."""
    topic = f"ref-{uuid.uuid4().hex[:8]}"
    app = streamkit.App("store-retention")
    table = app.global_table("ref", source=topic)

    async def scenario() -> None:
        async with KafkaIO(broker) as io:
            await io.create_topic(topic, 2)
            await aproduce_json(broker, topic, [(f"k{i}", {"v": i}, i % 2) for i in range(10)])  # 5 a partition
            stores = GlobalStores([table], tmp_path / "read")
            try:
                await stores.catch_up(io)
                assert stores.stores[0].positions == {0: 5, 1: 5}
                await aproduce_json(broker, topic, [(f"k{i}", {"v": i}, i % 2) for i in range(10, 20)])
                real = io.log_start_offsets

                async def retained(t: str, parts: list[int]) -> dict[int, int]:  # offsets 0..7 of partition 0 gone
                    return {p: 8 if p == 0 else start for p, start in (await real(t, parts)).items()}

                monkeypatch.setattr(io, "log_start_offsets", retained)
                with caplog.at_level(logging.WARNING, logger="streamkit.joins.global_store"):
                    assert await stores.stores[0].read_on(io) == 2 + 5  # partition 0 from offset 8 on, 1 from 5
                assert [table.get(f"k{i}") for i in (10, 12, 14, 16, 18)] == [None, None, None, {"v": 16}, {"v": 18}]
                assert len(table) == 10 + 2 + 5 and stores.stores[0].positions == {0: 10, 1: 10}
                assert stores.status()["ref"]["skipped"] == {"lost to retention": 3}  # what the heartbeat shows
                [said] = [r.getMessage() for r in caplog.records]
                assert f"global table 'ref': {topic}[0] offsets 5..7 were deleted" in said
                assert "up to 3 record(s) skipped" in said
                # all that partition 0 gained since, deleted before it was read: said once, not every round
                await aproduce_json(broker, topic, [(f"k{i}", {"v": i}, 0) for i in (20, 22)])  # offsets 10, 11

                async def all_gone(t: str, parts: list[int]) -> dict[int, int]:
                    return {p: 12 if p == 0 else start for p, start in (await real(t, parts)).items()}

                monkeypatch.setattr(io, "log_start_offsets", all_gone)
                caplog.clear()
                with caplog.at_level(logging.WARNING, logger="streamkit.joins.global_store"):
                    for _ in range(3):
                        assert await stores.stores[0].read_on(io) == 0
                assert stores.stores[0].positions == {0: 12, 1: 10} and stores.stores[0].stats.lag == 0
                assert stores.status()["ref"]["skipped"] == {"lost to retention": 3 + 2}
                assert len(caplog.records) == 1 and "offsets 10..11 were deleted" in caplog.records[0].getMessage()
            finally:
                stores.close()
            caplog.clear()
            fresh = GlobalStores([table], tmp_path / "fresh")  # a copy that never read the topic lost nothing
            try:
                with caplog.at_level(logging.WARNING, logger="streamkit.joins.global_store"):
                    await fresh.catch_up(io)
                assert fresh.status()["ref"]["skipped"] == {} and caplog.records == []
                assert len(table) == 0 + 10  # partition 0 holds nothing from offset 12 on, partition 1 its 10
            finally:
                fresh.close()

    asyncio.run(scenario())
