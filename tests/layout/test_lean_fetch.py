"""The lean fetch path gives exactly the records aiokafka's own gives, from the same
batches, through the consumer's ``getall`` with and without a record limit."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.consumer.fetcher import FetchResult, PartitionRecords
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from streamkit.kafkaio.fetch import LeanPartitionRecords

TP = TopicPartition("t", 3)


def batches(sizes: list[int], base: int = 0) -> bytes:
    out, offset = b"", base
    for n in sizes:
        builder = DefaultRecordBatchBuilder(
            magic=2, compression_type=0, is_transactional=0, producer_id=-1, producer_epoch=-1, base_sequence=-1,
            batch_size=1 << 20,
        )  # fmt: skip
        for i in range(n):
            key = None if i % 7 == 3 else b"k%d" % (offset + i)
            value = None if i % 11 == 5 else b'{"v":%d}' % i
            headers = [("sk", b"abcdef%d" % i)] if i % 2 else []
            builder.append(i, timestamp=1_700_000_000_000 + i, key=key, value=value, headers=headers)
        raw = bytearray(builder.build())
        raw[0:8] = offset.to_bytes(8, "big")  # the base offset, as the broker assigns it
        out += bytes(raw)
        offset += n
    return out


class _Assignment:
    active = True
    paused = False

    def __init__(self) -> None:
        self.position = 0

    def state_value(self, tp: TopicPartition) -> Any:
        return self

    def consumed_to(self, offset: int) -> None:
        self.position = offset


def drain(cls: type, data: bytes, fetch_offset: int, limit: int | None, **kw: Any) -> tuple[list[Any], list[int]]:
    """Every record ``getall`` returns, and the position after each call."""
    assignment = _Assignment()
    assignment.position = fetch_offset
    records = cls(TP, MemoryRecords(data), None, fetch_offset, kw.get("kd"), kw.get("vd"), True, kw.get("iso", 0))
    result = FetchResult(TP, assignment=assignment, partition_records=records, backoff=0)
    got: list[Any] = []
    positions: list[int] = []
    while result.has_more():
        got += result.getall(limit)
        positions.append(assignment.position)
    return got, positions


@pytest.mark.parametrize("limit", [None, 1, 7, 50, 1000])
@pytest.mark.parametrize("fetch_offset", [100, 113, 119])  # a fetch answers from the batch holding it
def test_the_lean_path_gives_what_aiokafka_gives(limit: int | None, fetch_offset: int) -> None:
    data = batches([20, 1, 33, 9], base=100)
    lean = drain(LeanPartitionRecords, data, fetch_offset, limit)
    assert lean == drain(PartitionRecords, data, fetch_offset, limit)
    assert lean[0] and lean[0][0].offset == fetch_offset and lean[0][-1].offset == 162
    assert any(r.headers for r in lean[0]) and any(r.key is None for r in lean[0])


def test_deserializers_and_read_committed_take_aiokafka_s_own_path() -> None:
    data = batches([5, 5])
    for kw in ({"kd": lambda k: k and k.upper()}, {"vd": len}, {"iso": 1}):
        assert drain(LeanPartitionRecords, data, 0, 3, **kw) == drain(PartitionRecords, data, 0, 3, **kw)
    assert drain(LeanPartitionRecords, data, 0, None, vd=len)[0][1].value == len(b'{"v":1}')
