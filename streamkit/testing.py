"""Helpers for tests, examples and benchmarks: create topics, produce keyed JSON fast,
read a whole topic back.

Every helper exists in two forms: ``async def a<name>(...)`` for code that already runs
an event loop, and a blocking ``<name>(...)`` wrapper (``asyncio.run``) for tests and
scripts.

Reading "a whole topic" means: every partition up to the high watermark that the broker
reports in a *fetch* response. ``end_offsets`` / ``ListOffsets`` is not used: the
reference broker (Tansu 0.6) answers it wrongly when the last batch holds more than one
record (DESIGN.md, "The reference broker").
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka import errors
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.partitioner import murmur2

__all__ = [
    "DEFAULT_TOPIC_CONFIGS",
    "acreate_topic",
    "aproduce_json",
    "aread_topic",
    "create_topic",
    "default_partition",
    "produce_json",
    "read_topic",
    "unique_topic_name",
]

# Set at creation so DescribeConfigs reports them: Tansu's DescribeConfigs returns only
# configs given at creation, and quixstreams fails (KeyError 'retention.ms') on an input
# topic without them. -1 (keep forever) is what Tansu does anyway: it has no retention.
DEFAULT_TOPIC_CONFIGS: dict[str, str] = {"retention.ms": "-1", "retention.bytes": "-1"}

Key = bytes | str | None
Record = tuple[Key, Any] | tuple[Key, Any, int | None]


def unique_topic_name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def default_partition(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner for a non-null key: murmur2(key) & 0x7fffffff mod n."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


# --------------------------------------------------------------------------- topics


async def acreate_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    *,
    configs: Mapping[str, str] | None = None,
    replication_factor: int = 1,
    timeout: float = 10.0,
) -> str:
    """Create ``name`` with ``partitions`` partitions and wait until its metadata shows them.

    ``configs`` are added to ``DEFAULT_TOPIC_CONFIGS`` (pass a value of None to drop one).
    Raises ``aiokafka.errors.TopicAlreadyExistsError`` if it exists.
    """
    merged = {**DEFAULT_TOPIC_CONFIGS, **(configs or {})}
    merged = {k: str(v) for k, v in merged.items() if v is not None}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000))
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(name, partitions, replication_factor, topic_configs=merged)],
            timeout_ms=int(timeout * 1000),
        )
        # aiokafka returns per-topic errors in the response instead of raising them.
        for topic_error in response.topic_errors:
            code, message = topic_error[1], topic_error[2] if len(topic_error) > 2 else None
            if code:
                error = errors.for_code(code)
                raise error(f"create topic {name!r}: {message or error.__name__}")
        deadline = time.monotonic() + timeout
        while True:
            meta = await admin.describe_topics([name])
            found = [t for t in meta if t.get("topic") == name and t.get("error_code", 0) == 0]
            if found and len(found[0].get("partitions", [])) == partitions:
                return name
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name} not visible with {partitions} partitions")
            await asyncio.sleep(0.02)
    finally:
        await admin.close()


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    *,
    configs: Mapping[str, str] | None = None,
    replication_factor: int = 1,
    timeout: float = 10.0,
) -> str:
    """Blocking form of :func:`acreate_topic`; returns the topic name."""
    return asyncio.run(
        acreate_topic(
            bootstrap,
            name,
            partitions,
            configs=configs,
            replication_factor=replication_factor,
            timeout=timeout,
        )
    )


# --------------------------------------------------------------------------- produce


def _encode_key(key: Key) -> bytes | None:
    if key is None or isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, bytearray | memoryview):
        return bytes(key)
    raise TypeError(f"record key must be bytes, str or None, not {type(key).__name__}")


def _encode_value(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value  # None is a tombstone; bytes are taken as already encoded
    return orjson.dumps(value)


async def aproduce_json(
    bootstrap: str,
    topic: str,
    records: Iterable[Record],
    *,
    headers: Sequence[tuple[str, bytes]] | None = None,
    timestamp_ms: int | None = None,
    batch_bytes: int = 256 * 1024,
    compression_type: str | None = None,
    producer: AIOKafkaProducer | None = None,
) -> int:
    """Produce keyed JSON records fast; returns how many were written (all acknowledged).

    ``records`` are ``(key, value)`` or ``(key, value, partition)``. Keys are bytes, str
    (UTF-8) or None; values are orjson-encoded unless already ``bytes`` (None is a
    tombstone). Without an explicit partition a keyed record goes where Kafka's default
    partitioner puts it (murmur2), a null key round-robin. Records are appended to large
    batches per partition (``batch_bytes``) and every partition is sent concurrently;
    order within a partition is the order given.
    """
    own = producer is None
    if own:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            linger_ms=5,
            max_batch_size=batch_bytes,
            max_request_size=max(1 << 20, 4 * batch_bytes),
            compression_type=compression_type,
            enable_idempotence=False,  # unsupported by the reference broker
        )
        await producer.start()
    try:
        partitions = sorted(await producer.partitions_for(topic) or ())
        if not partitions:
            raise ValueError(f"topic {topic!r} has no partitions (does it exist?)")
        n = len(partitions)
        by_partition: dict[int, list[tuple[bytes | None, bytes | None]]] = defaultdict(list)
        placement: dict[bytes, int] = {}
        round_robin = 0
        count = 0
        for record in records:
            key = _encode_key(record[0])
            value = _encode_value(record[1])
            part = record[2] if len(record) > 2 else None
            if part is None:
                if key is None:
                    part = partitions[round_robin % n]
                    round_robin += 1
                else:
                    part = placement.get(key)
                    if part is None:
                        part = placement[key] = partitions[default_partition(key, n)]
            by_partition[part].append((key, value))
            count += 1

        hdrs = list(headers or ())
        futures: list[asyncio.Future] = []

        async def send_partition(part: int, items: list) -> None:
            batch = producer.create_batch()
            for key, value in items:
                ts = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
                if batch.append(timestamp=ts, key=key, value=value, headers=hdrs) is None:
                    batch.close()
                    futures.append(await producer.send_batch(batch, topic, partition=part))
                    batch = producer.create_batch()
                    if batch.append(timestamp=ts, key=key, value=value, headers=hdrs) is None:
                        raise ValueError(f"record larger than batch_bytes={batch_bytes}")
            if batch.record_count():
                batch.close()
                futures.append(await producer.send_batch(batch, topic, partition=part))

        await asyncio.gather(*(send_partition(p, items) for p, items in by_partition.items()))
        await asyncio.gather(*futures)
        return count
    finally:
        if own:
            await producer.stop()


def produce_json(bootstrap: str, topic: str, records: Iterable[Record], **kwargs: Any) -> int:
    """Blocking form of :func:`aproduce_json`."""
    return asyncio.run(aproduce_json(bootstrap, topic, records, **kwargs))


# --------------------------------------------------------------------------- read


async def aread_topic(
    bootstrap: str,
    topic: str,
    *,
    partitions: Iterable[int] | None = None,
    timeout: float = 30.0,
    max_partition_fetch_bytes: int = 4 << 20,
) -> list[ConsumerRecord]:
    """Every record of ``topic`` (or of the given ``partitions``), from offset 0 up to the
    high watermark the first fetch response reports for each partition.

    Records come partition by partition, in offset order. No consumer group is used and
    nothing is committed. Values are raw bytes (decode with ``orjson.loads``).
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
        max_partition_fetch_bytes=max_partition_fetch_bytes,
        fetch_max_bytes=max(52428800, max_partition_fetch_bytes),
    )
    await consumer.start()
    try:
        if partitions is None:
            deadline = time.monotonic() + timeout
            found = consumer.partitions_for_topic(topic)
            while not found:
                await consumer._client.force_metadata_update()  # noqa: SLF001
                found = consumer.partitions_for_topic(topic)
                if not found and time.monotonic() > deadline:
                    raise ValueError(f"topic {topic!r} not found")
            partitions = found
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        out: dict[TopicPartition, list[ConsumerRecord]] = {tp: [] for tp in tps}
        end: dict[TopicPartition, int] = {}
        deadline = time.monotonic() + timeout
        while True:
            if len(end) == len(tps):
                positions = [await consumer.position(tp) for tp in tps]
                if all(pos >= end[tp] for pos, tp in zip(positions, tps, strict=True)):
                    break
            batches = await consumer.getmany(timeout_ms=100, max_records=100_000)
            for tp in tps:
                if tp not in end:
                    hw = consumer.highwater(tp)
                    if hw is not None:
                        end[tp] = hw
            for tp, msgs in batches.items():
                out[tp].extend(msgs)
            if time.monotonic() > deadline:
                have = {tp.partition: len(out[tp]) for tp in tps}
                raise TimeoutError(f"read_topic({topic}) timed out: have {have}, ends {end}")
        # Drop anything written after the first fetch's watermark (the topic may be live).
        return [m for tp in tps for m in out[tp] if m.offset < end[tp]]
    finally:
        await consumer.stop()


def read_topic(bootstrap: str, topic: str, **kwargs: Any) -> list[ConsumerRecord]:
    """Blocking form of :func:`aread_topic`."""
    return asyncio.run(aread_topic(bootstrap, topic, **kwargs))
