"""The lean fetch path gives exactly the records aiokafka's own gives, from the same
batches, through the consumer's ``getall`` with and without a record limit; except that
a batch stamped on its first record stamps its header-less records."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.consumer.fetcher import FetchResult, PartitionRecords
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from streamkit.kafkaio.fetch import LeanPartitionRecords

TP = TopicPartition("t", 3)


def batches(sizes: list[int], base: int = 0, first: int = 0, stamp_first: bool = False) -> bytes:
    """Record batches of ``sizes`` records from offset ``base``; ``first``: the offset delta
    of a batch's first record (above 0: as if compaction removed the ones before)."""
    out, offset = b"", base
    for n in sizes:
        builder = DefaultRecordBatchBuilder(
            magic=2, compression_type=0, is_transactional=0, producer_id=-1, producer_epoch=-1, base_sequence=-1,
            batch_size=1 << 20,
        )  # fmt: skip
        for i in range(first, n):
            key = None if i % 7 == 3 else b"k%d" % (offset + i)
            value = None if i % 11 == 5 else b'{"v":%d}' % i
            headers = [("sk", b"abcdef%d" % i)] if i % 2 or (stamp_first and i == first) else []
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


@pytest.mark.parametrize("fetch_offset", [100, 104])  # from the stamped record, and from after it
def test_header_less_records_of_a_stamped_batch_carry_its_stamp(fetch_offset: int) -> None:
    data = batches([8, 6], base=100, stamp_first=True)
    lean, _ = drain(LeanPartitionRecords, data, fetch_offset, None)
    own, _ = drain(PartitionRecords, data, fetch_offset, None)
    assert [r.offset for r in lean] == [r.offset for r in own] == list(range(fetch_offset, 114))
    stamp = (("sk", b"abcdef0"),)  # each batch's first record (delta 0)
    for r, o in zip(lean, own):
        assert r.headers == (tuple(o.headers) or stamp)
    assert sum(1 for o in own if not o.headers) >= 4  # there was something to inherit


def test_a_batch_whose_first_record_is_gone_stamps_nothing() -> None:
    data = batches([8], base=100, first=2, stamp_first=True)  # compacted: offsets 102..107
    lean, _ = drain(LeanPartitionRecords, data, 100, None)
    assert [r.offset for r in lean] == list(range(102, 108))
    assert lean == drain(PartitionRecords, data, 100, None)[0]
    assert any(not r.headers for r in lean)
