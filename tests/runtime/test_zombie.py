"""A zombie processor (KIP-232): paused with SIGSTOP through a rebalance, then resumed.

The group moves on without it; when it wakes up, its checkpoint is rejected (a newer
generation owns its partitions in the progress log), it drops what it did not commit,
and the job's state stays exact: in the stores, and as restored from the changelog
once every store is lost.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import cast

import orjson
from aiokafka import AIOKafkaProducer

from streamkit.kafkaio import KafkaIO
from streamkit.runtime.progress import PROGRESS_TOPIC, ProgressLog
from streamkit.state.changelog import changelog_topic
from streamkit.state.restore import ChangelogSource, restore_store
from streamkit.testing import create_topic, produce_json
from tests.runtime.jobs import Job, make_records, read_state, reference, wait_until_committed

PARTITIONS = 4


async def progress_records(broker: str, group: str) -> list[dict]:
    async with KafkaIO(broker) as io:
        recs, _ = await io.read(PROGRESS_TOPIC, 0, 0)
    return [orjson.loads(r.value) for r in recs if r.key == group.encode()]


async def read_progress(broker: str, group: str) -> ProgressLog:
    """The group's progress as a member reads it (what it keeps and what it rejects)."""
    async with KafkaIO(broker) as io:
        reader = ProgressLog(io, cast("AIOKafkaProducer", None), group)  # reads only
        await reader.refresh()
    return reader


def wait_for_fence_against(job: Job, zombie_parts: set[tuple[str, int]], generation: int, timeout: float = 60) -> None:
    """Until another member has fenced the zombie's partitions with a newer generation."""
    deadline = time.monotonic() + timeout
    while True:
        recs = asyncio.run(progress_records(job.bootstrap, f"streamkit-{job.app}"))
        fenced = {(t, p) for r in recs if r["gen"] > generation for t, p, o in r["parts"] if o is None}
        if zombie_parts <= fenced:
            return
        assert time.monotonic() < deadline, "the group did not move on without the paused worker"
        time.sleep(0.2)


def test_a_paused_processor_is_fenced_and_its_checkpoint_rejected(broker: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    job = Job(broker, f"zombie-{tag}", create_topic(broker, f"zin-{tag}", PARTITIONS), tmp_path / "state", 4)
    records = make_records(60_000, 500)
    produce_json(broker, job.topic, records[:20_000])
    try:
        zombie = job.start_worker()
        job.start_worker()
        wait_until_committed(job, PARTITIONS, 5_000)
        deadline = time.monotonic() + 60  # the other worker may have joined first, alone
        while True:
            recs = asyncio.run(progress_records(broker, f"streamkit-{job.app}"))
            if any(str(zombie.pid) in r["member"] for r in recs):
                break
            assert time.monotonic() < deadline, "the worker to pause was never assigned anything"
            time.sleep(0.1)
        member = next(r["member"] for r in recs if str(zombie.pid) in r["member"])
        mine = [r for r in recs if r["member"] == member]
        generation = max(r["gen"] for r in mine)
        zombie_parts = {(t, p) for r in mine if r["gen"] == generation for t, p, _ in r["parts"]}
        assert zombie_parts, "the paused worker hosted nothing"
        zombie.send_signal(signal.SIGSTOP)
        feeder = threading.Thread(target=produce_json, args=(broker, job.topic, records[20_000:]))
        feeder.start()
        wait_for_fence_against(job, zombie_parts, generation)
        zombie.send_signal(signal.SIGCONT)  # it wakes up believing it still owns its partitions
        feeder.join()
        wait_until_committed(job, PARTITIONS, len(records), timeout=180)
    finally:
        job.stop_all()
    log = job.log(zombie)
    assert f"checkpoint of generation {generation} rejected" in log, log[-3000:]
    state, _ = read_state(job, 4)
    assert state == reference(records)
    # no commit of the zombie's old generation was accepted after the fence
    recs = asyncio.run(progress_records(broker, f"streamkit-{job.app}"))
    fence_at = min(
        i for i, r in enumerate(recs) if r["gen"] > generation and any((t, p) in zombie_parts for t, p, _ in r["parts"])
    )
    # A zombie stopped in the middle of a checkpoint (past its read of the log) appends its
    # commit on waking, after the fence: no broker refuses it, so every reader must.
    late = [r for r in recs[fence_at:] if r["member"] == member and r["gen"] == generation]
    reader = asyncio.run(read_progress(broker, f"streamkit-{job.app}"))
    refused = {(r.member, r.generation, r.partition) for r in reader.rejected if r.newer > generation}
    for r in late:
        mine_late = {(t, p) for t, p, _ in r["parts"]}
        assert {(member, generation, tp) for tp in mine_late} <= refused, f"a zombie's late commit was taken: {r}"
    assert reader.newest_generation(zombie_parts) > generation
    # every store lost: each processor restored from its changelog (what a worker does
    # on taking a processor without a store), where nothing the zombie may have written
    # after the fence is applied
    shutil.rmtree(job.state_dir / job.app)
    asyncio.run(restore_all(job, PARTITIONS))
    assert read_state(job, 4)[0] == reference(records)


async def restore_all(job: Job, processors: int) -> None:
    from tests.runtime.job_app import app

    async with KafkaIO(job.bootstrap) as io:
        for pid in range(processors):
            path = job.state_dir / job.app / f"processor-{pid}"
            plan = await restore_store(ChangelogSource(io, changelog_topic(job.app), app.tables, processors), pid, path)
            assert plan is not None, f"processor {pid} has nothing in the changelog"
