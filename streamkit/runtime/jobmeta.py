"""The job's record in the cluster: its initial processor count (p0), fixed at first start.

Kept in the internal topic `__streamkit_jobs` (one partition, so one total order). The
first record for an app wins: concurrent first starts each append their claim and then
read back, so they all agree on the earliest one. A worker whose configuration disagrees
with the recorded count is refused, because key -> processor placement (linear hashing
over p0) and every local store depend on it.
"""

from __future__ import annotations

import time

import orjson
from aiokafka import AIOKafkaProducer

from streamkit.errors import JobMismatchError, TopicNotFoundError
from streamkit.kafkaio import KafkaIO

JOBS_TOPIC = "__streamkit_jobs"


async def recorded_processor_count(io: KafkaIO, app_name: str) -> int | None:
    """The job's recorded p0 (None: the job never started, or no job ever did)."""
    try:
        records = await io.read_topic(JOBS_TOPIC)
    except TopicNotFoundError:
        return None
    for rec in records:
        if rec.key == app_name.encode() and rec.value:
            return int(orjson.loads(rec.value)["processors"])
    return None


async def resolve_processor_count(io: KafkaIO, app_name: str, configured: int | None, default: int) -> int:
    """Return the job's p0, recording it on first start; refuse a disagreeing configuration."""
    await io.create_topic(JOBS_TOPIC, 1)
    recorded = await recorded_processor_count(io, app_name)
    if recorded is None:
        claim = configured if configured is not None else default
        producer = AIOKafkaProducer(bootstrap_servers=io.bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(
                JOBS_TOPIC,
                key=app_name.encode(),
                value=orjson.dumps({"processors": claim, "created": time.time()}),
            )
        finally:
            await producer.stop()
        recorded = await recorded_processor_count(io, app_name)
        assert recorded is not None
    if configured is not None and configured != recorded:
        raise JobMismatchError(
            f"job {app_name!r} was created with {recorded} processors; this worker is configured "
            f"with processors={configured}. The initial processor count cannot change (placement "
            f"depends on it): use processors={recorded}"
        )
    return recorded
