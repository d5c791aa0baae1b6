"""Small Kafka operations the runtime and the CLI share.

High watermarks come from fetch responses, never from ListOffsets: the reference broker
answers ListOffsets wrongly when the last batch holds several records (DESIGN.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAlreadyExistsError

from streamkit.errors import BrokerUnreachableError, TopicNotFoundError

# Tansu's DescribeConfigs only reports configs set at creation; peers (quixstreams) need these.
CREATE_CONFIGS: dict[str, str] = {"retention.ms": "604800000", "retention.bytes": "-1"}


async def start_admin(bootstrap: str, timeout: float = 10.0) -> AIOKafkaAdminClient:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000))
    try:
        await admin.start()
    except (KafkaConnectionError, KafkaError, OSError) as exc:
        await admin.close()
        raise BrokerUnreachableError(f"no Kafka broker answers at {bootstrap} ({exc})") from None
    return admin


async def partition_counts(admin: AIOKafkaAdminClient, topics: Sequence[str]) -> dict[str, int]:
    """Physical partition count per topic; TopicNotFoundError names the missing one."""
    meta = await admin.describe_topics(list(topics))
    counts: dict[str, int] = {}
    for t in meta:
        if t.get("error_code", 0) == 0 and t.get("partitions"):
            counts[t["topic"]] = len(t["partitions"])
    for name in topics:
        if name not in counts:
            raise TopicNotFoundError(
                f"topic {name!r} does not exist (create it: streamkit topics create {name} --partitions N)"
            )
    return counts


async def ensure_topic(
    admin: AIOKafkaAdminClient, name: str, partitions: int, timeout: float = 10.0
) -> int:
    """Create `name` if it does not exist; return its partition count once visible."""
    try:
        await admin.create_topics(
            [NewTopic(name, partitions, 1, topic_configs=dict(CREATE_CONFIGS))],
            timeout_ms=int(timeout * 1000),
        )
    except TopicAlreadyExistsError:
        pass
    deadline = time.monotonic() + timeout
    while True:
        try:
            return (await partition_counts(admin, [name]))[name]
        except TopicNotFoundError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)


async def high_watermarks(
    consumer: AIOKafkaConsumer, partitions: Sequence[TopicPartition], timeout: float = 10.0
) -> dict[TopicPartition, int]:
    """High watermark of each partition, read from fetch responses of an assigned consumer.

    The consumer must be manually assigned `partitions` (no group). Its positions are
    moved; callers seek afterwards.
    """
    result: dict[TopicPartition, int] = {}
    pending = set(partitions)
    deadline = time.monotonic() + timeout
    for tp in pending:
        consumer.seek(tp, 0)
    while pending:
        await consumer.getmany(*pending, timeout_ms=100, max_records=1)
        for tp in list(pending):
            hw = consumer.highwater(tp)
            if hw is not None:
                result[tp] = hw
                pending.discard(tp)
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"no fetch response for {sorted(pending)} within {timeout}s")
    return result


async def read_to_end(
    bootstrap: str, topic: str, timeout: float = 10.0
) -> list[ConsumerRecord]:
    """Every record of `topic` up to each partition's high watermark, in offset order per partition."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic)
        if parts is None:
            await consumer._client.force_metadata_update()
            parts = consumer.partitions_for_topic(topic)
        if not parts:
            raise TopicNotFoundError(f"topic {topic!r} does not exist")
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        hws = await high_watermarks(consumer, tps, timeout)
        out: list[ConsumerRecord] = []
        todo = {tp for tp in tps if hws[tp] > 0}
        for tp in tps:
            consumer.seek(tp, 0)
        deadline = time.monotonic() + timeout
        while todo:
            batch = await consumer.getmany(*todo, timeout_ms=200)
            for tp, recs in batch.items():
                out.extend(r for r in recs if r.offset < hws[tp])
                if recs and recs[-1].offset + 1 >= hws[tp]:
                    todo.discard(tp)
            if todo and time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to its end within {timeout}s")
        return out
    finally:
        await consumer.stop()


def by_partition(records: Sequence[ConsumerRecord]) -> Mapping[int, list[ConsumerRecord]]:
    out: dict[int, list[ConsumerRecord]] = {}
    for r in records:
        out.setdefault(r.partition, []).append(r)
    return out
