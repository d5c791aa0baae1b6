"""Producers in the layout change protocol on the real broker (also in other processes,
also paused with SIGSTOP), and late-record detection."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from typer.testing import CliRunner

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from streamkit.cli import app as cli_app
from streamkit.kafkaio import FetchedRecord, KafkaIO
from streamkit.layout.check import check_topic
from streamkit.layout.model import TopicLayout
from streamkit.layout.protocol import LayoutCoordinator
from streamkit.layout.registry import (
    ACKS_TOPIC,
    LayoutRegistry,
)
from streamkit.layout.stamps import classify_record, record_epoch
from streamkit.producer import Producer

from .broker_util import Proc, deliver, misordered, name, read_partitions

# ---------------------------------------------------------------- producers


def test_two_producer_processes_ack_expansion_and_shrink(broker: str, tmp_path: Path) -> None:
    topic = name("lay-2p")

    async def setup() -> None:
        async with LayoutCoordinator(broker) as co:
            await co.create(topic, 2, capacity=8)

    asyncio.run(setup())
    procs = [Proc(broker, topic, f"p{i}", tmp_path, keys=40, rate=1500) for i in range(2)]
    try:

        async def changes() -> list[Any]:
            out = []
            async with LayoutCoordinator(broker, ack_timeout=5.0) as co:
                await asyncio.sleep(0.6)
                out.append(await co.expand(topic, 4))
                await asyncio.sleep(0.4)
                out.append(await co.expand(topic, 6))
                await asyncio.sleep(0.4)
                out.append(await co.shrink(topic, 3, delay=0))
                await asyncio.sleep(0.4)
            return out

        results = asyncio.run(changes())
        outs = [p.finish() for p in procs]
    finally:
        for p in procs:
            p.kill()
    ids = {p.producer_id for p in procs}
    for r in results:
        assert ids <= r.acked and r.fenced == frozenset(), r
        assert r.waited < 3.0
    for o in outs:
        assert o["fences"] == [] and o["stats"]["acks"] >= 3 and o["epoch"] == 4 and o["sent"] > 500

    async def verify() -> tuple[TopicLayout, dict[int, list[FetchedRecord]], Any]:
        async with LayoutRegistry(broker) as reg:
            lay = await reg.load(topic)
        return lay, await read_partitions(broker, lay), await check_topic(broker, topic)

    lay, recs, report = asyncio.run(verify())
    assert report.violations == [] and report.counts["ok"] == sum(o["sent"] for o in outs)
    # every record sits where its stamped epoch's layout put its key
    for p, lst in recs.items():
        for r in lst:
            assert lh_bucket(key_hash(r.key), lay.n0, lay.active_at(record_epoch(r.headers))) == p
    delivered = deliver(lay, recs)
    assert len(delivered) == report.counts["ok"]
    assert misordered(delivered) == []
    # the same adversarial consumer without the gates does break the order: the test can fail
    assert misordered(deliver(lay, recs, gated=False))


def test_paused_producer_is_fenced_not_silently_misordered(broker: str, tmp_path: Path) -> None:
    topic = name("lay-stop")

    async def setup() -> None:
        async with LayoutCoordinator(broker) as co:
            await co.create(topic, 2, capacity=4)

    asyncio.run(setup())
    normal = Proc(broker, topic, "steady", tmp_path, keys=30, rate=1500)
    paused = Proc(broker, topic, "sleeper", tmp_path, keys=30, rate=3000, lease_ms=1500, heartbeat_ms=500)
    try:
        time.sleep(0.5)
        os.kill(paused.proc.pid, signal.SIGSTOP)
        time.sleep(0.1)

        async def change() -> Any:
            async with LayoutCoordinator(broker, ack_timeout=2.0) as co:
                return await co.expand(topic, 4)

        t0 = time.monotonic()
        res = asyncio.run(change())
        waited = time.monotonic() - t0
        os.kill(paused.proc.pid, signal.SIGCONT)
        time.sleep(1.0)
        outs = {"steady": normal.finish(), "sleeper": paused.finish()}
    finally:
        normal.kill()
        paused.kill()
    assert res.fenced == frozenset({paused.producer_id})
    assert normal.producer_id in res.acked
    assert 2.0 <= waited < 6.0
    assert res.layout.seals[-1].fenced == (paused.producer_id,)
    # the paused producer learnt it was fenced; the other one was not
    assert outs["sleeper"]["fences"] == [[topic, 2]] and outs["steady"]["fences"] == []
    assert outs["sleeper"]["epoch"] == 2 and outs["sleeper"]["stats"]["acks"] >= 1

    async def verify() -> tuple[TopicLayout, dict[int, list[FetchedRecord]], Any]:
        async with LayoutRegistry(broker) as reg:
            lay = await reg.load(topic)
        return lay, await read_partitions(broker, lay), await check_topic(broker, topic)

    lay, recs, report = asyncio.run(verify())
    delivered = deliver(lay, recs)
    # Not silent: every record delivered out of order is recognised as late by its epoch.
    for r in misordered(delivered):
        v = classify_record(lay, r.partition, r.offset, record_epoch(r.headers), key_hash(r.key))
        assert v.violation, (r, v)
    flagged = {(v["partition"], v["offset"]) for v in report.violations}
    assert {(r.partition, r.offset) for r in misordered(delivered)} <= flagged
    for v in report.violations:
        assert paused.producer_id.endswith("-" + v["producer"]) and v["record_epoch"] == 1 and v["seal_epoch"] == 2


def test_in_flight_records_of_a_stopped_producer_are_reported(broker: str) -> None:
    """The case fencing cannot prevent, made deterministic: a batch that was already on
    its way when its producer stopped lands after the seal with the old epoch."""
    topic = name("lay-late")

    async def go() -> None:
        async with LayoutCoordinator(broker, ack_timeout=1.0) as co:
            lay = await co.create(topic, 1, capacity=2)
            key = next(f"k{i}" for i in range(1000) if lh_bucket(key_hash(f"k{i}".encode()), 1, 2) == 1)
            stay = next(f"s{i}" for i in range(1000) if lh_bucket(key_hash(f"s{i}".encode()), 1, 2) == 0)
            async with Producer(broker, client_id="good") as p:
                await (await p.send(topic, key, {"p": "x", "k": key, "seq": 1}))
                await (await p.send(topic, stay, {"p": "x", "k": stay, "seq": 1}))
                r = await co.expand(topic, 2)
                assert p.layout(topic).epoch == 2
                raw = AIOKafkaProducer(bootstrap_servers=broker)
                await raw.start()
                try:
                    hdr = [("streamkit.epoch", b"1"), ("streamkit.producer", b"ghost-1")]
                    for k in (key, stay):
                        await raw.send_and_wait(
                            topic, orjson.dumps({"p": "x", "k": k, "seq": 2}), key=k.encode(), partition=0, headers=hdr
                        )
                finally:
                    await raw.stop()
                md = await (await p.send(topic, key, {"p": "x", "k": key, "seq": 3}))
                assert md.partition == 1
            lay = r.layout
            rep = await check_topic(broker, topic)
            assert len(rep.violations) == 1 and rep.late_harmless == 1
            v = rep.violations[0]
            assert (v["producer"], v["key"], v["record_epoch"], v["seal_epoch"], v["moved"]) == (
                "ghost-1",
                key,
                1,
                2,
                True,
            )
            recs = await read_partitions(broker, lay)
            bad = misordered(deliver(lay, recs))
            assert [(r.partition, orjson.loads(r.value)["seq"]) for r in bad] == [(0, 2)]

    asyncio.run(go())
    res = CliRunner().invoke(cli_app, ["topics", "check", topic, "-b", broker])
    assert res.exit_code == 2 and "VIOLATION late" in res.output and "ghost-1" in res.output


def test_seal_is_raised_to_acknowledged_ends_when_a_high_watermark_read_lags(
    broker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defence in depth: each ack carries where the producer's acknowledged batches end,
    and the seal is at least there.  The coordinator's high-watermark read is made to
    lag (it answers the offsets before the producer wrote); without the ends the seal
    would sit below every record and all of them would count as late."""
    topic = name("lay-lag")

    async def go() -> None:
        async with LayoutCoordinator(broker, ack_timeout=2.0) as co:
            await co.create(topic, 2, capacity=4)
            stale = await co.io.high_watermarks(topic, range(4))
            async with Producer(broker, client_id="lagged") as p:
                for i in range(200):
                    await p.send(topic, f"k{i}", {"seq": i})
                await p.flush()
                real = await co.io.high_watermarks(topic, range(4))
                assert real[0] > 0 and real[1] > 0

                async def lagging(t: str, parts: Any) -> dict[int, int]:
                    return {q: stale.get(q, 0) for q in parts}

                monkeypatch.setattr(co.io, "high_watermarks", lagging)
                r = await co.expand(topic, 4)
                assert p.producer_id in r.acked
            seal = r.layout.seals[-1]
            assert {q: seal.seal_offset(q) for q in (0, 1)} == {0: real[0], 1: real[1]}
            monkeypatch.undo()
            rep = await check_topic(broker, topic)
            assert rep.violations == [] and rep.counts["ok"] == 200

    asyncio.run(go())


def test_a_change_waits_for_every_live_producer_when_a_fetch_of_the_acks_answers_empty(
    broker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tansu answers a fetch with what it gathered within max_wait_ms: with 1 ms, from
    0 to about 150 records, fewer on a busy machine.  The coordinator finds the live
    producers by reading the acks topic to its end: were a short or empty answer taken
    for the end, it would miss producers, seal without waiting for them and leave
    their records placed before their switch beyond the seal (the soak test's rare
    failure).  Here the first fetch of the acks topic at every offset (and size)
    answers empty."""
    topic = name("lay-empty")
    seen: set[tuple[int, Any]] = set()

    async def go() -> None:
        async with LayoutCoordinator(broker, ack_timeout=5.0) as co:
            await co.create(topic, 2, capacity=4)
            real_fetch = co.io.fetch

            async def flaky(t: str, part: int, offset: int, **kw: Any) -> tuple[list[FetchedRecord], int]:
                recs, hw = await real_fetch(t, part, offset, **kw)
                if t == ACKS_TOPIC and (offset, kw.get("max_bytes")) not in seen:
                    seen.add((offset, kw.get("max_bytes")))
                    return [], hw
                return recs, hw

            async with Producer(broker, client_id="steady") as p:
                stop = asyncio.Event()

                async def produce() -> int:
                    n = 0
                    while not stop.is_set():
                        await p.send(topic, f"k{n % 50}", {"seq": n})
                        n += 1
                        await asyncio.sleep(0.002)
                    return n

                sending = asyncio.create_task(produce())
                await asyncio.sleep(0.5)
                monkeypatch.setattr(co.io, "fetch", flaky)
                r = await co.expand(topic, 4)
                monkeypatch.undo()
                await asyncio.sleep(0.3)
                stop.set()
                sent = await sending
                await p.flush()
            assert seen, "the acks topic was not read"
            assert p.producer_id in r.waited_for and p.producer_id in r.acked
            rep = await check_topic(broker, topic)
            assert rep.violations == [] and rep.counts["ok"] == sent

    asyncio.run(go())


def test_expand_uses_create_partitions_where_the_broker_has_it(broker: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tansu lacks CreatePartitions; pretend it has it and check the call (before any
    announcement), then that a refusal leaves the layout untouched."""
    topic = name("lay-grow")
    calls: list[tuple[str, int]] = []

    class Refused(Exception):
        pass

    async def supports(self: KafkaIO, api_key: int) -> bool:
        return api_key == 37

    async def create_partitions(self: KafkaIO, t: str, total: int, timeout: float = 30.0) -> None:
        calls.append((t, total))
        raise Refused("pretend the broker refused")

    async def go() -> TopicLayout:
        async with LayoutCoordinator(broker) as co:
            await co.create(topic, 2, capacity=3)
            monkeypatch.setattr(KafkaIO, "supports_api", supports)
            monkeypatch.setattr(KafkaIO, "create_partitions", create_partitions)
            with pytest.raises(Refused):
                await co.expand(topic, 6)
            return await co.registry.load(topic)

    lay = asyncio.run(go())
    assert calls == [(topic, 6)]
    assert lay.epoch == 1 and lay.active == 2
