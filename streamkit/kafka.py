"""Small Kafka operations the runtime and the CLI share.

High watermarks come from fetch responses, never from ListOffsets: the reference broker
answers ListOffsets wrongly when the last batch holds several records (DESIGN.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAlreadyExistsError, for_code

from streamkit.errors import BrokerUnreachableError, TopicNotFoundError

# Set at creation so DescribeConfigs reports them: Tansu's DescribeConfigs returns only
# configs given at creation, and peers (quixstreams: KeyError 'retention.ms') need these.
if TYPE_CHECKING:
    from streamkit.layout._kafka import KafkaIO

CREATE_CONFIGS: dict[str, str] = {"retention.ms": "604800000", "retention.bytes": "-1"}


async def start_admin(bootstrap: str, timeout: float = 10.0) -> AIOKafkaAdminClient:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000))
    try:
        await admin.start()
    except (KafkaConnectionError, KafkaError, OSError) as exc:
        await admin.close()
        raise BrokerUnreachableError(f"no Kafka broker answers at {bootstrap} ({exc})") from None
    return admin


async def input_partition_counts(io: "KafkaIO", topics: Sequence[str]) -> dict[str, int]:
    """Physical partition count per topic, asked without auto-creating (Tansu creates a
    topic just by being asked about it); TopicNotFoundError names the missing one."""
    counts: dict[str, int] = {}
    for name in topics:
        n = await io.partition_count(name)
        if n is None:
            raise TopicNotFoundError(
                f"topic {name!r} does not exist (create it: streamkit topics create {name} --partitions N)"
            )
        counts[name] = n
    return counts


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


async def create_topic(
    admin: AIOKafkaAdminClient,
    name: str,
    partitions: int,
    *,
    configs: Mapping[str, str] = CREATE_CONFIGS,
    replication_factor: int = 1,
    timeout: float = 10.0,
    exist_ok: bool = False,
) -> int:
    """Create `name` with `configs` set at creation; return its partition count once visible.

    Without `exist_ok`, the per-topic error of the response is raised (aiokafka returns
    it instead of raising: `TopicAlreadyExistsError` if the topic exists) and the wait lasts
    until the metadata shows all `partitions` (TimeoutError after `timeout`). With it,
    creation errors are ignored and the wait lasts until the topic shows up with any
    partition count (TopicNotFoundError after `timeout`).
    """
    try:
        response = await admin.create_topics(
            [NewTopic(name, partitions, replication_factor, topic_configs=dict(configs))],
            timeout_ms=int(timeout * 1000),
        )
    except TopicAlreadyExistsError:
        if not exist_ok:
            raise
    else:
        if not exist_ok:
            for topic_error in response.topic_errors:
                code, message = topic_error[1], topic_error[2] if len(topic_error) > 2 else None
                if code:
                    error = for_code(code)
                    raise error(f"create topic {name!r}: {message or error.__name__}")
    deadline = time.monotonic() + timeout
    while True:
        try:
            count = (await partition_counts(admin, [name]))[name]
        except TopicNotFoundError:
            if exist_ok and time.monotonic() > deadline:
                raise
        else:
            if exist_ok or count == partitions:
                return count
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {name} not visible with {partitions} partitions")
        await asyncio.sleep(0.02)


async def ensure_topic(
    admin: AIOKafkaAdminClient, name: str, partitions: int, timeout: float = 10.0
) -> int:
    """Create `name` if it does not exist; return its partition count once visible."""
    return await create_topic(admin, name, partitions, timeout=timeout, exist_ok=True)


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


async def read_partitions_to_end(
    consumer: AIOKafkaConsumer, partitions: Sequence[TopicPartition], timeout: float = 10.0
) -> dict[TopicPartition, list[ConsumerRecord]]:
    """Every record of `partitions` (assigned manually to `consumer`, no group) from offset 0
    up to the high watermark of each partition's first fetch response, in offset order per
    partition. Positions are moved. `timeout` bounds the watermark fetch and the reading each.
    """
    hws = await high_watermarks(consumer, partitions, timeout)
    out: dict[TopicPartition, list[ConsumerRecord]] = {tp: [] for tp in partitions}
    todo = {tp for tp in partitions if hws[tp] > 0}
    for tp in partitions:
        consumer.seek(tp, 0)
    deadline = time.monotonic() + timeout
    while todo:
        batch = await consumer.getmany(*todo, timeout_ms=200)
        for tp, recs in batch.items():
            out[tp].extend(r for r in recs if r.offset < hws[tp])
        for tp in list(todo):
            if await consumer.position(tp) >= hws[tp]:
                todo.discard(tp)
        if todo and time.monotonic() > deadline:
            have = {tp.partition: len(out[tp]) for tp in partitions}
            ends = {tp.partition: hws[tp] for tp in partitions}
            topics = sorted({tp.topic for tp in partitions})
            raise TimeoutError(
                f"could not read {', '.join(topics)} to its end within {timeout}s: "
                f"have {have}, ends {ends}"
            )
    return out


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
        out = await read_partitions_to_end(consumer, tps, timeout)
        return [r for tp in tps for r in out[tp]]
    finally:
        await consumer.stop()
