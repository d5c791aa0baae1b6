"""Shared tasks and key-level concurrency with real processes on the real broker: jobs
with more processors than partitions (each processor owning a key range of a
partition), `streamkit scale` beyond the partition count under load, and key-concurrent
handlers killed with IC ranges in their checkpoints."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from streamkit.kafkaio import KafkaIO
from streamkit.layout.protocol import LayoutCoordinator
from tests.runtime.scale_job import ScaleJob


async def _start(job: ScaleJob, io: KafkaIO, workers: int, capacity: int | None = None) -> None:
    async with LayoutCoordinator(job.broker, ack_timeout=5.0) as co:
        await co.create(job.topic, job.partitions, capacity=capacity or job.partitions)
    await io.create_topic(job.out, 2)
    for _ in range(workers):
        job.start_worker()
    for _ in range(2):
        job.start_producer()
    await job.wait_growth(io, 600)


def _run(
    job: ScaleJob, workers: int, during: Callable[[KafkaIO], Awaitable[None]] | None = None, capacity: int | None = None
) -> list:
    """Start the job under load, run ``during``, finish (the producers' reports)."""
    reports: list = []

    async def scenario() -> None:
        async with KafkaIO(job.broker) as io:
            await _start(job, io, workers, capacity)
            if during is not None:
                await during(io)
            reports.extend(await job.finish(io))
        job.stop_workers()

    try:
        asyncio.run(scenario())
    finally:
        job.cleanup()
    return reports


def _run_shared(job: ScaleJob, workers: int) -> tuple[list, str]:
    """Run the job under load to the end; the producers' reports and what `status` showed."""
    shown: list[str] = []

    async def look(io: KafkaIO) -> None:
        shown.append(await asyncio.to_thread(job.status))

    reports = _run(job, workers, look)
    assert [w.returncode for w in job.workers] == [0] * workers
    return reports, shown[0]


def _cells(shown: str, border: str = "│") -> list[list[str]]:
    """The rows of the tables `status` printed, as lists of cells (``border="┃"``: the headers)."""
    return [[c.strip() for c in line.split(border)[1:-1]] for line in shown.splitlines() if line.startswith(border)]


def _partition_rows(shown: str, topic: str) -> dict[int, str]:
    return {int(row[1]): " ".join(row) for row in _cells(shown) if row[0] == topic}


def test_three_partitions_two_processors(broker: str, tmp_path: Path) -> None:
    """Every partition's keys belong to both processors (h mod 2): each applies its half."""
    job = ScaleJob(broker, tmp_path, p0=2, partitions=3)
    reports, shown = _run_shared(job, workers=2)
    job.verify(reports, 2, counts=(2,))
    rows = _partition_rows(shown, job.topic)
    assert sorted(rows) == [0, 1, 2], shown
    header = next(row for row in _cells(shown, "┃") if row[:2] == ["topic", "partition"])
    ic = header.index("IC ranges")  # a handler without concurrency finishes records in order: none
    assert all(row[ic] == "0" for row in _cells(shown) if row[0] == job.topic), shown
    for part in range(3):  # partition q holds h = q mod 3: both parities, one per processor
        assert "0, 1" in rows[part] and "shared: 0 h%6=" in rows[part] and "1 h%6=" in rows[part], shown


def test_one_partition_four_processors_over_two_workers(broker: str, tmp_path: Path) -> None:
    """One partition, four key ranges: two on each worker (fetched once per worker)."""
    job = ScaleJob(broker, tmp_path, p0=4, partitions=1)
    reports, shown = _run_shared(job, workers=2)
    job.verify(reports, 4, counts=(4,))
    row = _partition_rows(shown, job.topic)[0]
    assert "0, 1, 2, 3" in row and "shared: 0 h%4=0, 1 h%4=1, 2 h%4=2, 3 h%4=3" in row, shown
    hosts = [row[2] for row in _cells(shown) if row[1:2] == ["running"]]
    assert len(hosts) == 2 and all(len(pids.split(",")) == 2 for pids in hosts), shown


def test_scale_beyond_the_partitions_under_load(broker: str, tmp_path: Path) -> None:
    """2 partitions, 2 -> 5 processors with `streamkit scale` while producers write."""
    job = ScaleJob(broker, tmp_path, p0=2, partitions=2)
    scaled: list = []

    async def scale(io: KafkaIO) -> None:
        scaled.append(await asyncio.to_thread(job.scale, "--processors", "5"))
        assert scaled[0].returncode == 0, scaled[0].stdout + scaled[0].stderr

    reports = _run(job, 2, scale)
    assert [w.returncode for w in job.workers] == [0, 0]
    assert "5 processors" in scaled[0].stdout.splitlines()[-1], scaled[0].stdout
    job.verify(reports, 5, counts=(2, 3, 4, 5))


def test_a_sharer_killed_under_load_loses_nothing(broker: str, tmp_path: Path) -> None:
    """1 partition shared by 2 processors on 2 workers; one worker is SIGKILLed under load
    and a new one started: the survivor takes its processor over from its store."""
    job = ScaleJob(broker, tmp_path, p0=2, partitions=1)

    async def kill_and_replace(io: KafkaIO) -> None:
        job.kill9(job.workers[0].pid)
        await job.wait_growth(io, 300)  # the survivor hosts both sharers now
        new = job.start_worker()

        async def beating() -> bool:  # a worker stopped before it is up dies of the SIGTERM
            return any(s.pid == new.pid for s in await job.statuses(io))

        await job.wait_for(io, "the new worker's first heartbeat", beating)

    reports = _run(job, 2, kill_and_replace)
    assert [w.returncode for w in job.workers] == [-9, 0, 0]
    job.verify(reports, 2, counts=(2,))


def test_a_shared_partition_split_by_a_topic_expansion_under_load(broker: str, tmp_path: Path) -> None:
    """1 partition shared by 2 processors, then the topic grows to 2 (and 3) partitions:
    the new partitions wait for the shared parent's group position (its lowest sharer)
    to pass the seal, and each processor ends up owning whole partitions."""
    job = ScaleJob(broker, tmp_path, p0=2, partitions=3)
    job.partitions = 1  # created with 1 active partition, room for 3

    async def expand(io: KafkaIO) -> None:
        job.partitions = 3
        async with LayoutCoordinator(job.broker, ack_timeout=5.0) as co:
            for n in (2, 3):
                await co.expand(job.topic, n)
                await job.wait_growth(io, 300)

    reports = _run(job, 2, expand, capacity=3)
    assert [w.returncode for w in job.workers] == [0, 0]
    job.verify(reports, 2, counts=(2,))


def test_key_concurrent_processing_killed_again_and_again_applies_every_record_once(
    broker: str, tmp_path: Path
) -> None:
    """An async handler with concurrency 20 (slow keys queue up, others finish past them:
    checkpoints carry IC ranges), 2 workers on 2 partitions under load; the worker of
    processor 0 is SIGKILLed (each time once its heartbeat shows IC ranges) and replaced
    until two kills have left IC ranges in its store. Every record is applied exactly
    once, in order per key, and the restarts are shown to skip the records inside the
    ranges."""
    job = ScaleJob(broker, tmp_path, p0=2, partitions=2)
    job.env["SK_TEST_CONCURRENCY"] = "20"
    job.env["STREAMKIT_MAX_BATCH_RECORDS"] = "10000"  # more records in flight per batch: kills find IC ranges sooner
    with_ranges: list[int] = []

    async def kill_repeatedly(io: KafkaIO) -> None:
        from stores.base import StoreLockedError
        from stores.rocksdb import RocksDBStore

        async def host_with_ranges() -> int | None:
            """The newest live host of processor 0 whose heartbeat shows IC ranges on its
            partitions (a kill is only worth making then: the test waits for the event
            rather than counting on the worker's speed)."""
            live = {w.pid for w in job.live_workers}
            hosts = []
            for s in await job.statuses(io):
                parts = {f"{t}/{p}" for t, p in s.processors.get(0, [])}
                if s.pid in live and parts & set(s.ic_ranges):
                    hosts.append((s.at, s.pid))
            return max(hosts)[1] if hosts else None

        deadline = time.monotonic() + 180
        while len(with_ranges) < 2:
            assert time.monotonic() < deadline, f"two kills with IC ranges in the store not seen: {with_ranges}"
            job.kill9(await job.wait_for(io, "a host of processor 0 with IC ranges", host_with_ranges, 90))
            try:
                with RocksDBStore.open(str(job.tmp / "state" / job.app / "processor-0"), ["seen"]) as store:
                    ranges = sum(len(r) for r in store.checkpoint().ic_ranges.values())
            except StoreLockedError:  # another worker hosts processor 0 by now
                ranges = 0
            if ranges:
                with_ranges.append(ranges)
            job.start_worker()
            await job.wait_growth(io, 300)

    reports = _run(job, 2, kill_repeatedly)
    assert len(with_ranges) >= 2, with_ranges
    job.verify(reports, 2, counts=(2,))
    skipped = [int(line.split("skipped ")[1].split()[0]) for line in job.logs().splitlines() if "IC ranges" in line]
    assert sum(skipped) > 0, "no restart skipped a record inside an IC range"
