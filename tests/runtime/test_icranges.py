"""IC ranges: merging, snapshots of pending work, compaction, gap amending, the compact
encoding; 100,000 ranges through a real RocksDB checkpoint and a real progress record."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from stores.base import Checkpoint
from stores.rocksdb import RocksDBStore
from streamkit.kafkaio import KafkaIO
from streamkit.runtime import icranges
from streamkit.runtime.progress import Commit, ProgressLog


def _applied(stable: int, ranges: list[tuple[int, int]], upto: int) -> set[int]:
    return set(range(stable)) | {o for a, b in ranges for o in range(a, b + 1) if o < upto}


def test_merge_joins_touching_and_overlapping_ranges() -> None:
    assert icranges.merge([(5, 6), (1, 2), (3, 3), (8, 9), (9, 12)]) == [(1, 3), (5, 6), (8, 12)]
    assert icranges.merge([(5, 6), (1, 4)]) == [(1, 6)]


@given(st.sets(st.integers(0, 300)), st.integers(0, 50))
def test_a_snapshot_says_exactly_what_was_applied(done: set[int], extra: int) -> None:
    """Any set of finished offsets below a cursor: the stable offset and ranges name
    exactly the finished ones, and the ranges are sorted, disjoint and not touching."""
    cursor = max(done, default=0) + 1 + extra
    pending = set(range(cursor)) - done
    stable, ranges = icranges.snapshot(pending, cursor)
    assert stable == min(pending, default=cursor)
    assert _applied(stable, ranges, cursor) == set(range(cursor)) - pending
    assert all(b + 1 < c for (_, b), (c, _) in zip(ranges, ranges[1:], strict=False))
    assert all(a > stable for a, _ in ranges)
    assert icranges.decode(stable, icranges.encode(stable, ranges)) == ranges


def test_compaction_drops_what_the_stable_offset_passed() -> None:
    ranges = [(3, 5), (8, 10), (14, 20)]
    assert icranges.compact(ranges, 6) == [(8, 10), (14, 20)]
    assert icranges.compact(ranges, 9) == [(9, 10), (14, 20)]
    assert icranges.compact(ranges, 21) == []


def test_gap_amending_skips_the_fetched_records_inside_the_ranges() -> None:
    offsets = list(range(10, 30))
    keep, skipped = icranges.skip_applied(offsets, [(12, 14), (20, 20), (29, 40)])
    assert [offsets[i] for i in keep] == [10, 11, 15, 16, 17, 18, 19, *range(21, 29)]
    assert skipped == 5


def test_ranges_loaded_ahead_of_the_cursor_stay_until_it_passes_them() -> None:
    # restarted at stable 100 with ranges (103, 105), (110, 111); fetched 100..104 so far,
    # of which 102 is pending
    stable, ranges = icranges.snapshot({102}, 105, [(103, 105), (110, 111)])
    assert (stable, ranges) == (102, [(103, 105), (110, 111)])
    assert icranges.snapshot(set(), 100, [(103, 105)]) == (100, [(103, 105)])


def _many(n: int) -> tuple[int, list[tuple[int, int]]]:
    """n ranges above stable offset 1,000: every other offset finished, some runs longer."""
    return 1_000, [(1_001 + 3 * i, 1_001 + 3 * i + (i % 2)) for i in range(n)]


def test_100_000_ranges_through_a_checkpoint(tmp_path: Path) -> None:
    stable, ranges = _many(100_000)
    with RocksDBStore.open(str(tmp_path / "s"), ["t"]) as store:
        store.commit({"t": {b"k": b"1"}}, Checkpoint(positions={("in", 0): stable}, ic_ranges={("in", 0): ranges}))
    with RocksDBStore.open(str(tmp_path / "s"), ["t"]) as store:
        loaded = store.checkpoint()
    assert loaded.positions == {("in", 0): stable} and loaded.ic_ranges == {("in", 0): ranges}


def test_100_000_ranges_through_a_progress_record(broker: str) -> None:
    stable, ranges = _many(100_000)
    text = icranges.encode(stable, ranges)
    assert len(text) < 600_000  # well inside a Kafka message (1 MB by default)

    async def go() -> list[tuple[int, int]]:
        from aiokafka import AIOKafkaProducer

        group = f"ic-{uuid.uuid4().hex[:8]}"
        async with KafkaIO(broker) as io:
            producer = AIOKafkaProducer(bootstrap_servers=broker, max_request_size=2 * 1024 * 1024)
            await producer.start()
            try:
                log = ProgressLog(io, producer, group)
                await log.start()
                await log.record("m0", 0, {}, Commit({("in", 0): stable}, ic={("in", 0, 0): (stable, text)}))
                reader = ProgressLog(io, producer, group)
                await reader.start()
                return reader.ic_ranges("in", 0, 0)
            finally:
                await producer.stop()

    assert asyncio.run(go()) == ranges
