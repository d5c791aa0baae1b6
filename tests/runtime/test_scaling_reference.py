"""Windows of every kind through scaling, against a reference from the input alone.

A job with a table of every window kind, two processors on a topic of four partitions
(each reads two from the start), two producers writing live (200 records/s each): their records up to 1 s out
of order (less than the 3 s grace: none of them late) and one in 40 seven seconds behind
(late for every time window, and marked so). It scales 2 -> 3 -> 4 -> 3 -> 2 processors,
growing in place: with a third worker from 4 processors on, the shrinks go through a
rebalance; on two workers with standby replicas, they are in place too. Through a
rebalance, it runs twice: with the workers' stores in one state directory, and with each
worker on a disk of its own, where a processor that moves finds no store of it (restored
from its changelog, a receiving store emptied and rebuilt). The worker hosting
the receiving processor is SIGKILLed as the 4 -> 3 shrink starts (with standbys, its
processors go on from them), and restarted. Whatever handed the keys over, every window holds the
reference's value, no on-time record is judged late (the marked ones are, but for a
session they fall in), and every close is sent with its final value (``scale_reference``).

The in-place variant runs on demand (``STREAMKIT_SCALING_KILLS=all``). In one of eight runs
at 300 records/s per producer it found 20 per-second windows of one second a record short
on the receiving processor's own partition, right after its promotion from a standby in the
rebalance that followed an in-place shrink: those records were judged late. CI once found the
same through a rebalance: 314 records of the retiring processor's partition judged late by
the receiving processor's time. Two ways to it are closed since (the key sets' times made one
while a partition paused for a bootstrap looked read to its end; a receiving store rebuilt
from the input on one time); neither was shown to be the cause, so a failure prints what
every worker said of the handovers."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest

from streamkit.kafkaio import KafkaIO
from streamkit.layout.protocol import LayoutCoordinator
from tests.runtime.scale_job import ScaleJob
from tests.runtime.scale_reference import verify_against_reference
from tests.runtime.test_scaling import _hosting, _scaled

TIMING = ("--disorder-ms", "1000", "--late-every", "40", "--late-ms", "7000")


OWN_DISKS = "through a rebalance, each worker on a disk of its own"
SHRINKS = [
    "through a rebalance",
    OWN_DISKS,
    *(["in place"] if os.environ.get("STREAMKIT_SCALING_KILLS") == "all" else []),
]
"""CI runs the shrinks through a rebalance, on a shared disk and on disks of their own;
``STREAMKIT_SCALING_KILLS=all`` the in-place ones too (about
70 s more, beyond the CI's time budget; they failed once in eight runs, cause not found: see the module docstring)."""


@pytest.mark.parametrize("shrinks", SHRINKS)
def test_every_window_kind_equals_the_reference_through_scaling_and_a_kill_during_a_shrink(
    broker: str, tmp_path: Path, shrinks: str
) -> None:
    job = ScaleJob(broker, tmp_path, p0=2, partitions=4, every_window=True, own_disks=shrinks == OWN_DISKS)
    if shrinks == "in place":  # and the killed worker's processors go on from their standbys
        job.env["STREAMKIT_STANDBY_REPLICAS"] = "1"
    reports: list = []
    scales = []

    async def scale(io: KafkaIO, n: int) -> None:
        result = await asyncio.to_thread(job.scale, "--processors", str(n))
        scales.append(result.stdout)
        assert result.returncode == 0, result.stdout + result.stderr
        await job.wait_growth(io, 600)

    async def scenario() -> None:
        async with KafkaIO(broker) as io:
            async with LayoutCoordinator(broker, ack_timeout=5.0) as co:
                await co.create(job.topic, 4, capacity=4)
            await io.create_topic(job.out, 2)
            for _ in range(2):
                job.start_worker()
            for i in range(2):
                job.start_producer(200, *TIMING, "--seed", str(i))
            await job.wait_growth(io, 900)
            await scale(io, 3)
            await scale(io, 4)
            if shrinks != "in place":  # a third worker: the next steps' processors on different workers
                third = job.start_worker().pid

                async def third_hosts() -> bool:
                    return any(s.pid == third and s.processors for s in await job.statuses(io))

                await job.wait_for(io, "the third worker to host a processor", third_hosts)
            # 4 -> 3: processor 3 retires into processor 1, whose host is killed as the step starts
            before = await job.job(io)

            async def receiving_host() -> int | None:  # (after a rebalance, once it hosts it again)
                return _hosting(await job.statuses(io), 1)

            host = await job.wait_for(io, "processor 1's host", receiving_host)
            result = await asyncio.to_thread(job.scale, "--processors", "3", "--no-wait")
            assert result.returncode == 0, result.stderr

            async def started() -> bool:
                return (await job.job(io)).epoch > before.epoch

            await job.wait_for(io, "the shrink to start", started)
            job.kill9(host)
            job.start_worker()
            done = await job.wait_for(io, "3 processors", lambda: _scaled(job, io, before.epoch), 180)
            assert done.p == 3
            await job.wait_growth(io, 600)
            await scale(io, 2)
            reports.extend(await job.finish(io))
        job.stop_workers()

    try:
        asyncio.run(scenario())
    finally:
        job.cleanup()
    assert [w.returncode for w in job.workers].count(-9) == 1
    job.verify(reports, 2, counts=(2, 3, 4))  # the whole stream applied once, each key's output in order
    try:
        late, marked = verify_against_reference(broker, job.topic, job.out, job.stores(2), 2)
    except AssertionError as exc:  # with what the workers said of the handovers
        raise AssertionError(f"{exc}{job.handovers()}") from None
    assert marked, "no late record written"
    for t in ("per_second", "hopping", "session", "sliding"):
        assert late[t] <= marked, f"{t}: {sorted(late[t] - marked)[:3]} are late, not marked"  # no on-time record
        # a marked record is late for every window of fixed bounds (it may extend a long session)
        assert t == "session" or late[t] == marked, f"{t}: {sorted(marked - late[t])[:3]} are marked, not late"
    logs = job.logs()
    assert "took over its partitions from processor 0 in place" in logs, "growth not in place"
    if shrinks == "in place":
        assert "took over the keys of retiring processor" in logs, "no shrink in place"
        assert re.search(r"standby of processor [13] promoted", logs), "no standby promoted"
    else:
        assert re.search(r"job epoch \d+ has [23] processors: rebalancing", logs), "no shrink through a rebalance"
    if shrinks == OWN_DISKS:  # a processor moved to a disk without its store
        assert "restored from the changelog" in logs, "no store restored from its changelog"
