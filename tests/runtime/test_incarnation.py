"""Local state knows its cluster: stores carry the job's incarnation, a worker refuses
stores of another one with one line, and `streamkit reset` starts the job over
(real worker processes, real brokers, real RocksDB)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from jobs import ROOT, Job, make_records, read_state, reference, wait_until_committed

from stores.rocksdb import RocksDBStore
from streamkit.broker import EmbeddedBroker
from streamkit.kafkaio import KafkaIO
from streamkit.runtime.status import read_statuses
from streamkit.testing import create_topic, produce_json

PARTS = 2


def run_job(job: Job, records: list[tuple[str, dict[str, int]]]) -> None:
    create_topic(job.bootstrap, job.topic, PARTS)
    produce_json(job.bootstrap, job.topic, records)
    job.start_worker()
    try:
        wait_until_committed(job, PARTS, len(records), timeout=90)
    finally:
        job.stop_all()


def incarnations(job: Job) -> set[str]:
    found = set()
    for path in sorted((job.state_dir / job.app).glob("processor-*")):
        store = RocksDBStore.open(str(path), create=False)
        try:
            found.add(store.checkpoint().extra.get("incarnation"))
        finally:
            store.close()
    return found


def wait_until_handled(job: Job, n: int, timeout: float = 90.0) -> None:
    """Until the running worker's heartbeat says it handled ``n`` records (the group's Kafka
    offsets say nothing here: reset cannot rewind them on the test broker)."""

    async def handled() -> int:
        async with KafkaIO(job.bootstrap) as io:
            return max((s.handled for s in await read_statuses(io, job.app) if s.alive), default=0)

    deadline = time.monotonic() + timeout
    while asyncio.run(handled()) < n:
        assert time.monotonic() < deadline, "the worker did not handle the topic again"
        assert all(w.poll() is None for w in job.workers), "a worker died"
        time.sleep(0.3)


def cli(job: Job, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamkit.cli", *args],
        env=job.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_stores_of_another_cluster_are_refused_and_reset_starts_over(tmp_path: Path) -> None:
    first, second = make_records(600, 40), make_records(400, 30, start=600)
    with EmbeddedBroker() as old:
        job = Job(old.bootstrap, "incarnation-test", "incarnation-in", tmp_path / "state", processors=PARTS)
        run_job(job, first)
        assert read_state(job, PARTS)[0] == reference(first)
        (old_id,) = incarnations(job)
        assert old_id

    with EmbeddedBroker() as new:  # the same directory, a new cluster
        job.bootstrap = new.bootstrap
        create_topic(new.bootstrap, job.topic, PARTS)
        produce_json(new.bootstrap, job.topic, second)
        worker = job.start_worker()
        worker.wait(90)
        lines = job.log(worker).strip().splitlines()
        assert worker.returncode == 1, job.log(worker, 3000)
        assert lines[-1].startswith("error: store ") and old_id in lines[-1], lines[-1]
        assert "belongs to another incarnation of job 'incarnation-test'" in lines[-1]
        assert "streamkit reset" in lines[-1]
        assert read_state(job, PARTS)[0] == reference(first)  # refused, untouched

        reset = cli(job, "reset", "tests.runtime.job_app:app")
        assert reset.returncode == 0 and "2 local store(s)" in reset.stdout, reset.stderr
        job.workers.clear()
        job.start_worker()
        try:
            wait_until_committed(job, PARTS, len(second), timeout=90)
        finally:
            job.stop_all()
        assert read_state(job, PARTS)[0] == reference(second)
        (new_id,) = incarnations(job)
        assert new_id and new_id != old_id

        # --cluster: the job is forgotten there too; the next start is a first start that
        # reads the topic from the beginning again, under a new incarnation
        reset = cli(job, "reset", "tests.runtime.job_app:app", "--cluster")
        assert reset.returncode == 0 and "job record removed" in reset.stdout, reset.stderr
        assert not (job.state_dir / job.app).exists()
        job.workers.clear()
        job.start_worker()
        try:
            wait_until_handled(job, len(second))
        finally:
            job.stop_all()
        assert read_state(job, PARTS)[0] == reference(second)
        (third_id,) = incarnations(job)
        assert third_id not in (old_id, new_id)
