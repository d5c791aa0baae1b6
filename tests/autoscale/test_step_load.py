"""`streamkit autoscale --workers local` against a step load, in real processes on the test
broker: a job whose handler waits 1 ms per record (I/O-bound: a worker process applies
under 1,000 records/s, so capacity grows with processes even on two cores), input at
100 records/s, then 500 (5x), then 100 again, with a target utilization of 0.5.

The controller scales out soon after the lag starts to grow, the lag comes back under
its target while the load is high, and once the load falls it scales back in after the
stabilization time; a bounded number of scale operations (no flapping). Per-key state
exact and per-key output in order throughout (``ScaleJob.verify``). A second run SIGKILLs
a worker the controller started during its scale-out: it starts another, and the job is
just as exact. A third keeps a standby copy of each processor: the workers the controller
starts warm copies up before they take processors over, and no store is restored cold.

About 75 s each: on demand (``STREAMKIT_AUTOSCALE_LOAD=all``), beside the CI's 20-minute
budget."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamkit.kafkaio import KafkaIO
from streamkit.layout.protocol import LayoutCoordinator
from tests.runtime.jobs import ROOT
from tests.runtime.scale_job import ScaleJob

LOW, HIGH = 100, 500
HIGH_FROM, HIGH_UNTIL = 10.0, 50.0
"""Seconds after the producer starts: the load is high in between."""
STABILIZATION = 10.0
LAG_TARGET = 3_000
"""Records: the lag the job must come back under while the load is high."""
MAX_SCALES = 8
RESTORED = re.compile(r"processor (\d+) restored from the changelog in [\d.]+ s: (\d+) keys")

pytestmark = pytest.mark.skipif(
    os.environ.get("STREAMKIT_AUTOSCALE_LOAD") != "all",
    reason="on demand (STREAMKIT_AUTOSCALE_LOAD=all): three runs of about 75 s each, beyond the CI's time budget",
)


def _autoscaler(job: ScaleJob, log: Path) -> subprocess.Popen[str]:
    options = {"--workers": "local", "--min": "1", "--max": "6", "--interval": "1", "--window": "4",
               "--catch-up": "10", "--target-utilization": "0.5", "--stabilization": str(STABILIZATION),
               "--retry-after": "5", "--logs": str(job.tmp / "workers"),
               "--record": str(job.tmp / "history.jsonl")}  # fmt: skip
    cmd = [sys.executable, "-m", "streamkit.cli", "autoscale", "tests.runtime.scale_app:app"]
    cmd += [part for option in options.items() for part in option]
    cmd += ["--worker-arg=--log-level", "--worker-arg=INFO"]
    return subprocess.Popen(cmd, cwd=ROOT, env=job.env, stdout=open(log, "w"), stderr=subprocess.STDOUT, text=True)


def _scales(history: Path) -> list[tuple[float, str, int]]:
    """(when, out or in, workers wanted) of each scale the controller decided (its --record)."""
    if not history.exists():
        return []
    lines = [json.loads(line) for line in history.read_text().splitlines() if line.endswith("}")]
    return [(d["at"], d["action"], d["workers"]) for r in lines if (d := r.get("decision")) and d["action"] != "hold"]


@pytest.mark.parametrize(
    ("kill", "standbys"),
    [(False, False), (True, False), (False, True)],
    ids=["step load", "a worker killed during the scale-out", "standbys: no store restored cold"],
)
def test_the_autoscaler_follows_a_step_load_with_state_exact(
    broker: str, tmp_path: Path, kill: bool, standbys: bool
) -> None:
    job = ScaleJob(broker, tmp_path, p0=1, partitions=4)
    job.env["SK_TEST_DELAY_MS"] = "1"
    if standbys:  # a worker it starts warms a copy up before it takes a processor over
        job.env["STREAMKIT_STANDBY_REPLICAS"] = "1"
    log, history = tmp_path / "autoscale.log", tmp_path / "history.jsonl"
    asyncio.run(_topics(job))
    controller = _autoscaler(job, log)
    reports: list = []
    killed: list[int] = []

    async def scenario() -> None:
        async with KafkaIO(broker) as io:
            await job.wait_for(io, "the job to start", lambda: _has_job(job, io), 60)
            job.start_producer(LOW, "--steps", f"{HIGH_FROM}:{HIGH},{HIGH_UNTIL}:{LOW}")
            started = time.time()
            scaled_out = await job.wait_for(io, "a scale-out", lambda: _asked(history, lambda n: n > 1), 40)
            assert scaled_out - started < HIGH_FROM + 20, f"scaled out {scaled_out - started:.1f} s after the start"
            if kill:
                victim = await job.wait_for(io, "a second worker", lambda: _worker_pids(job, io, 2), 60)
                os.kill(victim[-1], signal.SIGKILL)
                killed.append(victim[-1])
            await job.wait_for(io, "the lag under its target", lambda: _lag_under(job, io, LAG_TARGET), 60)
            assert time.time() - started < HIGH_UNTIL + 5, "the lag came back under its target only after the load fell"
            await job.wait_for(io, "the scale back to one worker", lambda: _asked(history, lambda n: n == 1), 240)
            reports.extend(await asyncio.to_thread(job.stop_producers))
            await job.wait_consumed(io)

    try:
        asyncio.run(scenario())
    finally:
        controller.send_signal(signal.SIGTERM)
        try:
            controller.wait(60)
        finally:
            job.cleanup()
    text = log.read_text()
    assert controller.returncode == 0, text[-3000:]
    scales = _scales(history)
    assert 2 <= len(scales) <= MAX_SCALES, f"{len(scales)} scale operations:\n{text[-3000:]}"
    if kill:
        assert f"worker {killed[0]} exited with status -9: started another" in text
    job.verify(reports, _final_processors(job), counts=tuple(range(1, 7)))
    if standbys:
        logs = "".join(f.read_text() for f in sorted((tmp_path / "workers").glob("w*.log")))
        cold = [m for m in RESTORED.finditer(logs) if int(m[2]) > 0]
        assert not cold, f"stores restored cold: {[m[0] for m in cold]}"
        assert "promoted at changelog position" in logs  # the moves went through warm copies


async def _topics(job: ScaleJob) -> None:
    async with LayoutCoordinator(job.broker, ack_timeout=5.0) as co:
        await co.create(job.topic, job.partitions, capacity=job.partitions)
    async with KafkaIO(job.broker) as io:
        await io.create_topic(job.out, 2)


async def _has_job(job: ScaleJob, io: KafkaIO) -> bool:
    from streamkit.runtime.jobmeta import read_job

    return await read_job(io, job.app) is not None


async def _asked(history: Path, wanted: object) -> float | None:
    """When the controller first decided a scale to a worker count ``wanted`` accepts."""
    for at, _, n in _scales(history):
        if wanted(n):  # type: ignore[operator]
            return at
    return None


async def _worker_pids(job: ScaleJob, io: KafkaIO, n: int) -> list[int] | None:
    pids = sorted({s.pid for s in await job.statuses(io)})
    return pids if len(pids) >= n else None


async def _lag_under(job: ScaleJob, io: KafkaIO, most: int) -> bool:
    parts = list(range(job.partitions))
    committed = await io.committed(job.group, job.topic, parts)
    hws = await io.high_watermarks(job.topic, parts)
    return sum(hws[p] - committed.get(p, 0) for p in parts) < most


def _final_processors(job: ScaleJob) -> int:
    async def read() -> int:
        async with KafkaIO(job.broker) as io:
            return (await job.job(io)).p

    return asyncio.run(read())
