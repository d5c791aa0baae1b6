"""The one Kafka I/O layer: topic admin, high watermarks, reads to the end with holes
asked for again (:class:`KafkaIO`).  The group consumers are aiokafka's own."""

from streamkit.kafkaio.client import (
    ACKED_HOLE_WAIT,
    CREATE_CONFIGS,
    CREATE_PARTITIONS_API,
    HOLE_CONFIRM_FETCHES,
    HOLE_CONFIRM_SECONDS,
    FetchedRecord,
    KafkaIO,
    KafkaIOError,
)

__all__ = [
    "ACKED_HOLE_WAIT",
    "CREATE_CONFIGS",
    "CREATE_PARTITIONS_API",
    "HOLE_CONFIRM_FETCHES",
    "HOLE_CONFIRM_SECONDS",
    "FetchedRecord",
    "KafkaIO",
    "KafkaIOError",
]
