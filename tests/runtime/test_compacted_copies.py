"""KIP-253's rule for compacted topics, with the real broker, streamkit's producer and a
real worker: after an expansion, a keyed record of a key whose partition was split from
another is also written there (a copy, marked as one), so that compaction of the parent
drops the key's stale value; consumers skip the copies (the state stays exact)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from streamkit.layout.protocol import LayoutCoordinator
from streamkit.layout.stamps import COPY_HEADER
from streamkit.producer import Producer
from streamkit.testing import read_topic
from tests.runtime.jobs import Job, make_records, read_state, reference
from tests.runtime.test_strays import counts, expand, wait_drained

N0, CAPACITY = 2, 4


def _produce(broker: str, topic: str, records: list[tuple[str, dict[str, Any]]]) -> dict[str, int]:
    """Write ``records`` through streamkit's producer; its counters."""

    async def go() -> dict[str, int]:
        async with Producer(broker, client_id="compacted-test") as producer:
            for key, value in records:
                await producer.send(topic, key, value)
            await producer.flush()
            return producer.stats

    return asyncio.run(go())


def test_after_an_expansion_the_parent_partition_holds_each_moved_keys_latest_value(
    broker: str, tmp_path: Path
) -> None:
    topic = f"compacted-{uuid.uuid4().hex[:8]}"

    async def create() -> None:
        async with LayoutCoordinator(broker) as co:
            await co.create(topic, N0, capacity=CAPACITY, configs={"cleanup.policy": "compact"})

    asyncio.run(create())
    job = Job(broker, f"compacted-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", 2)
    before, after = make_records(600, 60), make_records(600, 60, start=600)
    try:
        assert _produce(broker, topic, before)["copies"] == 0  # the initial count: no partition was split
        job.start_worker()
        wait_drained(job, capacity=CAPACITY)
        expand(broker, topic, CAPACITY)
        stats = _produce(broker, topic, after)
        wait_drained(job, capacity=CAPACITY)
    finally:
        job.stop_all()
    assert all(w.returncode == 0 for w in job.workers), [job.log(w, 2000) for w in job.workers]
    state, _ = read_state(job, 2)
    assert counts(state) == counts(reference(before + after))  # every copy skipped
    moved = {k for k, _ in after if lh_bucket(key_hash(k.encode()), N0, CAPACITY) >= N0}
    assert moved and stats["copies"] == sum(k in moved for k, _ in after), stats
    latest = {k: v for k, v in after}
    last_in: dict[tuple[int, str], Any] = {}
    for r in read_topic(broker, topic):  # in offset order per partition: the last one stays after compaction
        last_in[(r.partition, r.key.decode())] = r
    for key in moved:
        h = key_hash(key.encode())
        parent, child = lh_bucket(h, N0, N0), lh_bucket(h, N0, CAPACITY)
        copy = last_in[(parent, key)]
        assert copy.headers[0][0] == COPY_HEADER and copy.headers[0][1].split(b":")[0] == str(child).encode()
        assert json.loads(copy.value) == latest[key]
        assert json.loads(last_in[(child, key)].value) == latest[key]
    for key in {k for k, _ in after} - moved:  # a key that stayed: nothing but its own records
        parent = lh_bucket(key_hash(key.encode()), N0, N0)
        assert not last_in[(parent, key)].headers or last_in[(parent, key)].headers[0][0] != COPY_HEADER
