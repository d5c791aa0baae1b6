"""The producers our users run, with their default partitioners, for the strays tests.

``aiokafka``: Kafka's default partitioner (murmur2 of the key modulo the physical
partition count), as the Java client places keys. ``confluent``: librdkafka's default
(``consistent_random``: CRC32 of the key modulo the physical count), what confluent-kafka,
and so quixstreams and most Python services, use. Neither knows of layouts: on a topic
with reserved capacity or after an expansion they write strays.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import orjson

from streamkit.testing import default_partition, produce_json

PARTITIONERS = ("aiokafka", "confluent")


def crc32_partition(key: bytes, partitions: int) -> int:
    """librdkafka's ``consistent_random`` partitioner for a non-empty key."""
    return zlib.crc32(key) % partitions


def plain_partition(partitioner: str, key: bytes, partitions: int) -> int:
    """Where ``partitioner``'s default puts ``key`` on a topic of ``partitions`` physical ones."""
    if partitioner == "confluent":
        return crc32_partition(key, partitions)
    return default_partition(key, partitions)


def produce_plain(partitioner: str, broker: str, topic: str, records: Sequence[tuple[str, Any]]) -> None:
    """Write ``records`` (key, JSON value) with ``partitioner``'s own client and its
    default partitioner; every record is acknowledged on return."""
    if partitioner == "aiokafka":
        produce_json(broker, topic, list(records))
        return
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker, "acks": "all", "linger.ms": 5, "enable.idempotence": False})
    failed: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key.encode(), value=orjson.dumps(value), on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    left = producer.flush(60)
    assert left == 0 and not failed, f"confluent-kafka: {left} unsent, failures {failed[:3]}"
