"""KafkaIO's hole check, against scripted fetch answers (pure logic: no broker).

Tansu (memory engine) sometimes leaves batches out of a fetch answer while producers
write the partition; asked again, they are there.  The group member's check of the same
runs against the real broker in tests/runtime/test_fetch_holes.py, and the layout soak
test (three producers writing while everything is read) depends on both.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from streamkit.kafkaio import KafkaIO


def batch(base: int, count: int) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i in range(count):
        b.append(i, timestamp=1_000, key=b"k", value=b"v%d" % (base + i), headers=[])
    data = bytearray(b.build())
    data[0:8] = struct.pack(">q", base)  # the broker assigns the base offset
    return bytes(data)


class ScriptedBroker:
    """Answers fetches from a log of (base, count) batches; the first ``drop_times``
    answers leave out the batches in ``dropped`` (Tansu's race)."""

    def __init__(self, log: Sequence[tuple[int, int]], dropped: Sequence[int] = (), drop_times: int = 0) -> None:
        self.log = list(log)
        self.dropped = set(dropped)
        self.drop_times = drop_times
        self.calls: list[int] = []

    async def fetch_raw(
        self, topic: str, partition: int, offset: int, *, max_wait_ms: int, max_bytes: int
    ) -> tuple[int, int, bytes | None]:
        self.calls.append(offset)
        dropping = len(self.calls) <= self.drop_times
        hw = self.log[-1][0] + self.log[-1][1]
        data = b"".join(
            batch(base, n) for base, n in self.log if base + n > offset and not (dropping and base in self.dropped)
        )
        return 0, hw, data or None


def fetch_all(broker: ScriptedBroker, offset: int = 0) -> list[int]:
    io = KafkaIO("unused:9092")
    io._fetch_raw = broker.fetch_raw  # type: ignore[method-assign]
    recs, _ = asyncio.run(io.read("t", 0, offset))
    return [r.offset for r in recs]


def test_a_batch_left_out_of_an_answer_is_asked_for_again() -> None:
    broker = ScriptedBroker([(0, 3), (3, 3), (6, 3)], dropped=[3], drop_times=1)
    assert fetch_all(broker) == list(range(9))
    assert broker.calls[:2] == [0, 3]  # cut at the hole, asked again there


def test_a_hole_that_stays_is_real_and_read_past() -> None:
    """Compaction leaves real holes (the layouts topic is compacted on Kafka)."""
    broker = ScriptedBroker([(0, 3), (6, 3)])
    assert fetch_all(broker) == [0, 1, 2, 6, 7, 8]
    assert broker.calls == [0, 3, 3, 3, 3]  # asked again after each pause before reading past it


def test_a_hole_at_the_requested_offset_is_checked_too() -> None:
    broker = ScriptedBroker([(0, 3), (3, 3), (6, 3)], dropped=[3], drop_times=1)
    assert fetch_all(broker, 3) == [3, 4, 5, 6, 7, 8]


def test_a_race_outlasting_the_first_ask_is_still_filled() -> None:
    broker = ScriptedBroker([(0, 2), (2, 2), (4, 2)], dropped=[2], drop_times=2)
    assert fetch_all(broker) == list(range(6))


def test_a_race_outlasting_three_asks_is_still_filled() -> None:
    """Tansu hands out a batch's offsets before it writes the batch: on a loaded machine
    the write can take longer than a few quick asks (it once outlasted 10 ms, and a worker
    read past a record that was only late)."""
    broker = ScriptedBroker([(0, 2), (2, 2), (4, 2)], dropped=[2], drop_times=3)
    assert fetch_all(broker) == list(range(6))
