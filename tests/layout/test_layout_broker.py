"""Layouts on the real broker: the registry and the change protocol's round trips."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from typer.testing import CliRunner

from streamkit.cli import app as cli_app
from streamkit.layout import model, transitions
from streamkit.layout.model import PartitionMode, TopicLayout
from streamkit.layout.protocol import LayoutCoordinator
from streamkit.layout.registry import (
    LAYOUTS_TOPIC,
    ConcurrentChangeError,
    LayoutRegistry,
    StaleLayoutError,
    encode_layout_record,
)
from streamkit.producer import Producer

from .broker_util import name

# ---------------------------------------------------------------- registry round trips


def test_create_expand_shrink_describe_round_trip(broker: str) -> None:
    topic = name("lay-rt")

    async def go() -> tuple[TopicLayout, TopicLayout, Any]:
        async with LayoutCoordinator(broker, ack_timeout=2.0) as co:
            created = await co.create(topic, 2, capacity=8)
            assert (created.epoch, created.active, created.physical) == (1, 2, 8)
            r = await co.expand(topic, 5)
            assert r.layout.epoch == 2 and r.layout.pending is None
            # (r.fenced is not checked: this test has no producer, and any producer of another
            # test on the session's broker that is busy through the 2 s ack wait is fenced,
            # whatever its name; test_layout_producers checks who is fenced)
            r = await co.shrink(topic, 3, delay=600)
            assert r.layout.draining == (3, 4)
            with pytest.raises(model.LayoutError, match="still draining"):
                await co.expand(topic, 6)
            lay, done, kept = await co.finish_drain(topic, [3])
            assert done == () and "drains until" in kept[3]
            lay, done, _ = await co.finish_drain(topic, [3], force=True)
            assert done == (3,) and lay.epoch == 4 and lay.mode(3) == PartitionMode.NONE
            info = await co.describe(topic)
        async with LayoutRegistry(broker) as fresh:
            again = await fresh.load(topic)
        return lay, again, info

    lay, again, info = asyncio.run(go())
    assert again == lay  # read back from the internal topic by a new client
    assert info.physical == 8 and set(info.high_watermarks) == set(range(8))
    runner = CliRunner()
    res = runner.invoke(cli_app, ["topics", "describe", topic, "-b", broker], env={"COLUMNS": "160"})
    assert res.exit_code == 0, res.output
    for word in ("epoch 4", "ReadOnly", "None", "ReadWrite", "shrink", "finish", "active 3", "physical 8"):
        assert word in res.output
    res = runner.invoke(cli_app, ["topics", "describe", topic, "--json", "-b", broker])
    assert TopicLayout.from_dict(orjson.loads(res.output)) == lay
    res = runner.invoke(cli_app, ["topics", "expand", topic, "-p", "6", "-b", broker])
    assert res.exit_code != 0 and "partitions [4] are still draining" in str(res.exception)
    res = runner.invoke(cli_app, ["topics", "expand", topic, "-p", "9", "-b", broker])
    assert res.exit_code != 0 and "does not support CreatePartitions" in str(res.exception)


def test_a_drain_waits_for_late_records_beyond_the_seal(broker: str) -> None:
    """finish_drain(groups=...) gives a draining partition up only when each group has
    read it to its end: a late record beyond the seal must be read (and reported), not
    silently dropped with the partition."""
    topic, group = name("lay-drain"), name("g")

    async def commit(offset: int) -> None:
        c = AIOKafkaConsumer(bootstrap_servers=broker, group_id=group, enable_auto_commit=False)
        await c.start()
        try:
            tp = TopicPartition(topic, 2)
            c.assign([tp])
            await c.commit({tp: offset})
        finally:
            await c.stop()

    async def go() -> None:
        async with LayoutCoordinator(broker, ack_timeout=1.0) as co:
            await co.create(topic, 2, capacity=4)
            await co.expand(topic, 3)
            async with Producer(broker, client_id="drainer") as p:
                for i in range(60):
                    await p.send(topic, f"k{i}", {"seq": i})
                await p.flush()
                r = await co.shrink(topic, 2, delay=600)
            seal = r.layout.seals[-1].seal_offset(2)
            assert seal is not None and seal > 0
            await commit(seal)
            raw = AIOKafkaProducer(bootstrap_servers=broker)
            await raw.start()
            try:  # a producer that missed the shrink: its record lands beyond the seal
                hdr = [("streamkit.epoch", str(r.layout.epoch - 1).encode()), ("streamkit.producer", b"ghost")]
                await raw.send_and_wait(topic, b"{}", key=b"late", partition=2, headers=hdr)
            finally:
                await raw.stop()
            _, done, kept = await co.finish_drain(topic, groups=[group])
            assert done == () and f"{group} at {seal}/{seal + 1}" in kept[2]
            await commit(seal + 1)
            lay, done, kept = await co.finish_drain(topic, groups=[group])
            assert done == (2,) and kept == {} and lay.mode(2) == PartitionMode.NONE

    asyncio.run(go())


def test_stale_layout_is_refused_and_reread(broker: str) -> None:
    topic = name("lay-stale")

    async def go() -> None:
        async with LayoutCoordinator(broker, ack_timeout=1.0) as co:
            await co.create(topic, 2, capacity=8)
            e2 = (await co.expand(topic, 3)).layout
            e3 = (await co.expand(topic, 4)).layout
        async with LayoutRegistry(broker) as reg:
            assert (await reg.load(topic)).epoch == 3
            # a zombie coordinator re-writes epoch 2 (older) into the registry
            p = AIOKafkaProducer(bootstrap_servers=broker)
            await p.start()
            try:
                key, value = encode_layout_record(e2, by="zombie")
                await p.send_and_wait(LAYOUTS_TOPIC, value, key=key, partition=0)
            finally:
                await p.stop()
            before = reg.stale_refused
            await reg.refresh()
            assert reg.get(topic) == e3 and reg.stale_refused == before + 1
            assert reg.refusals[-1].topic == topic and reg.refusals[-1].reason.startswith("stale")
            # metadata from another path (an assignment, a checkpoint): older -> refused, re-read
            assert await reg.offer(e2) == e3
            assert reg.stale_refused == before + 2
            with pytest.raises(StaleLayoutError):
                await reg.publish(e2)
            # a newer epoch named by a checkpoint: wait until the registry has it
            waiter = asyncio.create_task(reg.ensure_at_least(topic, 4, timeout=10))
            await asyncio.sleep(0.2)
            assert not waiter.done()
            async with LayoutCoordinator(broker, ack_timeout=1.0) as co:
                await co.expand(topic, 5)
            assert (await waiter).epoch == 4
        async with LayoutRegistry(broker) as fresh:  # from scratch: the zombie record is refused too
            assert (await fresh.load(topic)).epoch == 4
            assert any(r.topic == topic for r in fresh.refusals)
        # two coordinators announcing the same epoch: the first in the log wins
        async with LayoutRegistry(broker, client_id="a") as a, LayoutRegistry(broker, client_id="b") as b:
            base = await a.load(topic)
            await b.load(topic)
            await a.publish(transitions.expand(base, 6))
            with pytest.raises((ConcurrentChangeError, StaleLayoutError)):
                await b.publish(transitions.expand(base, 7))
            won = await b.load(topic)
            assert won.active == 6 and won.pending is not None
        async with LayoutCoordinator(broker, ack_timeout=1.0) as co:  # the stopped change is resumed
            r = await co.resume(topic)
            assert r.layout.pending is None and r.layout.epoch == 5

    asyncio.run(go())
