"""A growth in place spreads the processors over the workers there are: three workers of a
one-processor job (two of them idle, as the autoscaler starts them before it adds
processors), scaled to 3 processors live under load. Each joining processor is handed
its keys in place beside the one it splits from, then the worker that now hosts more
than its share asks for a rebalance, and every worker ends up hosting one processor,
with per-key state exact and output in order. Before, every processor stayed on the
first worker and the others idled until some unrelated rebalance."""

from __future__ import annotations

import asyncio
from pathlib import Path

from streamkit.kafkaio import KafkaIO
from tests.autoscale.test_step_load import _topics
from tests.runtime.scale_job import ScaleJob


def test_a_growth_in_place_spreads_the_processors_over_idle_workers(broker: str, tmp_path: Path) -> None:
    job = ScaleJob(broker, tmp_path, p0=1, partitions=4)
    reports: list = []
    hosted: list[list[int]] = []

    async def scenario() -> None:
        async with KafkaIO(broker) as io:
            await _topics(job)
            for _ in range(3):
                job.start_worker()
            job.start_producer(300)
            await job.wait_growth(io, 300)
            for n in (2, 3):
                result = await asyncio.to_thread(job.scale, "--processors", str(n))
                assert result.returncode == 0, result.stdout + result.stderr

            async def spread() -> list[list[int]] | None:
                shown = sorted(sorted(s.processors) for s in await job.statuses(io))
                return shown if shown == [[0], [1], [2]] else None

            hosted.extend(await job.wait_for(io, "a processor on each worker", spread, 90))
            await job.wait_growth(io, 300)
            reports.extend(await job.finish(io))
        job.stop_workers()

    try:
        asyncio.run(scenario())
    finally:
        job.cleanup()
    assert hosted == [[0], [1], [2]]
    assert "rebalancing to spread them" in job.logs()
    job.verify(reports, 3)
