"""The lean fetch path's loop over a fetched partition's records (``streamkit.kafkaio.fetch``).

A module of its own so that it can be compiled (``streamkit.compiled``): the class it
serves extends aiokafka's ``PartitionRecords``, a Python class, which a compiled module
cannot. It yields aiokafka's own ``ConsumerRecord`` objects.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aiokafka.errors as errors
from aiokafka.structs import ConsumerRecord

from streamkit.layout.stamps import NO_HEADERS, batch_stamp

__all__ = ["unpack_records"]


def unpack_records(partition_records: Any) -> Iterator[ConsumerRecord[bytes, bytes]]:
    """The records of ``partition_records`` (a ``LeanPartitionRecords``) from its fetch
    position on, advancing its ``next_fetch_offset`` as each is handed over."""
    tp = partition_records._tp
    topic, partition = tp.topic, tp.partition
    batches, check_crcs, record_of = partition_records._records, partition_records._check_crcs, ConsumerRecord
    while batches.has_next():
        batch = batches.next_batch()
        if check_crcs and not batch.validate_crc():
            raise errors.CorruptRecordException(f"Invalid CRC - {tp}")
        if not batch.is_control_batch:
            below = partition_records.next_fetch_offset  # a batch may start before it (compressed, or compacted)
            base, inherited = batch.base_offset, NO_HEADERS
            for r in batch:
                offset, headers = r.offset, r.headers
                if offset == base:
                    inherited = batch_stamp(headers)
                if offset < below:
                    continue
                key, value = r.key, r.value
                partition_records.next_fetch_offset = offset + 1
                yield record_of(
                    topic, partition, offset, r.timestamp, r.timestamp_type, key, value, r.checksum,
                    -1 if key is None else len(key), -1 if value is None else len(value),
                    tuple(headers) if headers else inherited,
                )  # fmt: skip
        partition_records.next_fetch_offset = batch.next_offset
