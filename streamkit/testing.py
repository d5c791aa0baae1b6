"""Helpers for tests, examples and benchmarks: :class:`TestDriver` (an app's handlers,
tables, windows and timers without a broker: ``streamkit.testdriver``); and, against a
broker, create topics, produce keyed JSON fast, read a whole topic back.

Every helper exists in two forms: ``async def a<name>(...)`` for code that already runs
an event loop, and a blocking ``<name>(...)`` wrapper (``asyncio.run``) for tests and
scripts. Where a helper takes ``bootstrap``, an address is a plaintext connection and a
:class:`streamkit.connection.Connection` a secured one.

Reading "a whole topic" means: every partition up to the high watermark that the broker
reports in a *fetch* response. ``end_offsets`` / ``ListOffsets`` is not used: the
reference broker (Tansu 0.6) answers it wrongly when the last batch holds more than one
record (docs/architecture.md, "Broker behaviours").
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2

from streamkit.connection import Connection, as_connection
from streamkit.kafkaio import CREATE_CONFIGS, FetchedRecord, KafkaIO
from streamkit.testdriver import DeadLetter, OutputRecord, TestDriver

__all__ = [
    "DEFAULT_TOPIC_CONFIGS",
    "DeadLetter",
    "OutputRecord",
    "TestDriver",
    "acreate_topic",
    "aproduce_json",
    "aread_topic",
    "create_topic",
    "default_partition",
    "produce_json",
    "read_topic",
    "unique_topic_name",
]

# The runtime's creation configs (streamkit.kafkaio.CREATE_CONFIGS: Tansu's DescribeConfigs
# reports only configs set at creation, and quixstreams needs them), but retention.ms -1
# (keep forever), which is what Tansu does anyway: it has no retention.
DEFAULT_TOPIC_CONFIGS: dict[str, str] = {**CREATE_CONFIGS, "retention.ms": "-1"}

Key = bytes | str | None
Record = tuple[Key, Any] | tuple[Key, Any, int | None] | tuple[Key, Any, int | None, int]


_P = ParamSpec("_P")
_T = TypeVar("_T")


def _blocking(afn: Callable[_P, Coroutine[Any, Any, _T]]) -> Callable[_P, _T]:
    """The blocking form ``<name>`` of ``a<name>``: the same call, run with ``asyncio.run``."""

    @functools.wraps(afn)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        return asyncio.run(afn(*args, **kwargs))

    run.__name__ = run.__qualname__ = afn.__name__[1:]
    run.__doc__ = f"Blocking form of :func:`{afn.__name__}`."
    return run


def unique_topic_name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def default_partition(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner for a non-null key: murmur2(key) & 0x7fffffff mod n."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


# --------------------------------------------------------------------------- topics


async def acreate_topic(
    bootstrap: str | Connection,
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
    async with KafkaIO(bootstrap, request_timeout_ms=int(timeout * 1000)) as io:
        await io.create_topic(
            name, partitions, configs=merged, replication_factor=replication_factor, timeout=timeout, exist_ok=False
        )
    return name


create_topic = _blocking(acreate_topic)


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
    bootstrap: str | Connection,
    topic: str,
    records: Iterable[Record],
    *,
    headers: Sequence[tuple[str, bytes]] | None = None,
    batch_headers: Sequence[tuple[str, bytes]] | None = None,
    timestamp_ms: int | None = None,
    batch_bytes: int = 256 * 1024,
    producer: AIOKafkaProducer | None = None,
) -> int:
    """Produce keyed JSON records fast; returns how many were written (all acknowledged).

    ``headers`` go on every record; ``batch_headers`` on the first record of each batch
    (and before ``headers`` there), as streamkit's producer writes its stamp.

    ``records`` are ``(key, value)``, ``(key, value, partition)`` or ``(key, value,
    partition, timestamp_ms)`` (a record's own timestamp; partition None: placed as
    below; else ``timestamp_ms``, else the time of sending). Keys are bytes, str
    (UTF-8) or None; values are orjson-encoded unless already ``bytes`` (None is a
    tombstone). Without an explicit partition a keyed record goes where Kafka's default
    partitioner puts it (murmur2), a null key round-robin. Records are appended to large
    batches per partition (``batch_bytes``) and every partition is sent concurrently;
    order within a partition is the order given.

    ``producer``: a started client to send with (kept running), e.g. one made with other
    settings (compression); by default one is made for the call.
    """
    own = producer is None
    if producer is None:
        producer = AIOKafkaProducer(
            **as_connection(bootstrap).client_kwargs(),
            acks="all",
            linger_ms=5,
            max_batch_size=batch_bytes,
            max_request_size=max(1 << 20, 4 * batch_bytes),
            enable_idempotence=False,  # unsupported by the reference broker
        )
        await producer.start()
    sender: AIOKafkaProducer = producer
    try:
        partitions = sorted(await sender.partitions_for(topic) or ())
        if not partitions:
            raise ValueError(f"topic {topic!r} has no partitions (does it exist?)")
        n = len(partitions)
        by_partition: dict[int, list[tuple[bytes | None, bytes | None, int | None]]] = defaultdict(list)
        placement: dict[bytes, int] = {}
        round_robin = 0
        count = 0
        for record in records:
            key = _encode_key(record[0])
            value = _encode_value(record[1])
            part = record[2] if len(record) > 2 else None
            stamp = record[3] if len(record) > 3 else timestamp_ms
            if part is None:
                if key is None:
                    part = partitions[round_robin % n]
                    round_robin += 1
                else:
                    part = placement.get(key)
                    if part is None:
                        part = placement[key] = partitions[default_partition(key, n)]
            by_partition[part].append((key, value, stamp))
            count += 1

        hdrs = list(headers or ())
        first = list(batch_headers or ()) + hdrs
        futures: list[asyncio.Future] = []

        async def send_partition(part: int, items: list) -> None:
            batch = sender.create_batch()
            for key, value, stamp in items:
                ts = stamp if stamp is not None else int(time.time() * 1000)
                h = hdrs if batch.record_count() else first
                if batch.append(timestamp=ts, key=key, value=value, headers=h) is None:
                    batch.close()
                    futures.append(await sender.send_batch(batch, topic, partition=part))
                    batch = sender.create_batch()
                    if batch.append(timestamp=ts, key=key, value=value, headers=first) is None:
                        raise ValueError(f"record larger than batch_bytes={batch_bytes}")
            if batch.record_count():
                batch.close()
                futures.append(await sender.send_batch(batch, topic, partition=part))

        await asyncio.gather(*(send_partition(p, items) for p, items in by_partition.items()))
        await asyncio.gather(*futures)
        return count
    finally:
        if own:
            await sender.stop()


produce_json = _blocking(aproduce_json)


# --------------------------------------------------------------------------- read


async def aread_topic(
    bootstrap: str | Connection, topic: str, *, partitions: Iterable[int] | None = None
) -> list[FetchedRecord]:
    """Every record of ``topic`` (or of the given ``partitions``), from offset 0 up to the
    high watermark a fetch response reports for each partition.

    Records come partition by partition, in offset order. No consumer group is used and
    nothing is committed. Values are raw bytes (decode with ``orjson.loads``).
    """
    async with KafkaIO(bootstrap) as io:
        return await io.read_topic(topic, partitions)


read_topic = _blocking(aread_topic)
