"""A topic mirrored from another cluster, as MirrorMaker copies it: every record with its
partition, key, value, timestamp and all its headers, those of the other cluster's
streamkit included (stamps of epochs this cluster never reached, forwarded strays sealed
under the other cluster's key). A job here applies every mirrored record once or
dead-letters it with a reason: nothing is dropped silently, and nothing stops.

Real worker processes on two real brokers (the other cluster's job expands its topic
twice while plain and streamkit producers write to it)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from streamkit.broker import EmbeddedBroker
from streamkit.kafkaio import FetchedRecord
from streamkit.layout.stamps import record_epoch
from streamkit.producer import Producer
from streamkit.testing import produce_json, read_topic
from tests.runtime.jobs import Job, make_records, read_state
from tests.runtime.test_strays import expand, layout_topic, wait_drained

N0, CAPACITY = 2, 4


def _produce(broker: str, topic: str, records: list[tuple[str, dict[str, Any]]]) -> None:
    """Through streamkit's producer: placed by the layout, stamped with its epoch."""

    async def go() -> None:
        async with Producer(broker, client_id="mirror-test") as producer:
            for key, value in records:
                await producer.send(topic, key, value)
            await producer.flush()

    asyncio.run(go())


def _mirror(records: list[FetchedRecord], broker: str, topic: str) -> None:
    """Append ``records`` to the same partitions of ``topic`` on ``broker``, in order."""

    async def go() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all", linger_ms=5)
        await producer.start()
        try:
            sent = [
                await producer.send(
                    topic, r.value, key=r.key, partition=r.partition, timestamp_ms=r.timestamp, headers=list(r.headers)
                )
                for r in records
            ]
            await asyncio.gather(*sent)
        finally:
            await producer.stop()

    asyncio.run(go())


def _by_key(records: list[FetchedRecord]) -> dict[str, tuple[int, int]]:
    """Per key: (records, sum of amounts)."""
    n: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for r in records:
        assert r.key is not None and r.value is not None
        key = r.key.decode()
        n[key] += 1
        total[key] += orjson.loads(r.value)["amount"]
    return {k: (n[k], total[k]) for k in n}


def test_a_topic_mirrored_from_another_cluster_is_applied_once_or_dead_lettered(broker: str, tmp_path: Path) -> None:
    waves = [make_records(600, 60, start=i * 600) for i in range(6)]
    with EmbeddedBroker() as other:
        source = layout_topic(other.bootstrap, N0, CAPACITY)
        there = Job(other.bootstrap, f"mirror-src-{uuid.uuid4().hex[:8]}", source, tmp_path / "there", N0)
        try:
            there.start_worker()
            for active in (N0, N0 + 1, N0 + 2):  # each count: streamkit's producer, then a plain one
                if active > N0:
                    expand(other.bootstrap, source, active)
                _produce(other.bootstrap, source, waves.pop(0))
                produce_json(other.bootstrap, source, waves.pop(0))  # strays, forwarded (sealed there)
                wait_drained(there, capacity=CAPACITY)  # forwarded at this count
        finally:
            there.stop_all()
        mirrored = read_topic(other.bootstrap, source)
    assert max(e for r in mirrored if (e := record_epoch(r.headers)) is not None) > 1
    assert any(h == "streamkit.stray.from" for r in mirrored for h, _ in r.headers)

    target = layout_topic(broker, N0, CAPACITY)  # this cluster's layout: epoch 1, two partitions active
    _mirror(mirrored, broker, target)
    here = Job(broker, f"mirror-{uuid.uuid4().hex[:8]}", target, tmp_path / "here", N0)
    try:
        here.start_worker(STREAMKIT_LAYOUT_EPOCH_WAIT="1")
        wait_drained(here, capacity=CAPACITY, timeout=180)
    finally:
        here.stop_all()
    assert all(w.returncode == 0 for w in here.workers), [here.log(w, 3000) for w in here.workers]
    log = here.log(here.workers[0])
    state, _ = read_state(here, N0)
    dead = read_topic(broker, f"{here.app}-dead-letters")
    reasons = Counter(dict(r.headers)["streamkit.error.reason"].decode() for r in dead)
    assert set(reasons) <= {"unknown-epoch", "misplaced", "late"}, reasons
    assert reasons["unknown-epoch"] > 0, reasons
    # every mirrored record once: applied (counted in the state) or dead-lettered
    dead_by_key = _by_key(dead)
    want = _by_key(mirrored)
    got = {
        k: (state.get(k, {}).get("n", 0) + dead_by_key.get(k, (0, 0))[0],
            state.get(k, {}).get("sum", 0) + dead_by_key.get(k, (0, 0))[1])
        for k in want
    }  # fmt: skip
    assert got == want and set(state) <= set(want)
    assert "(its seal does not verify): handled as ordinary input" in log, log[-3000:]
