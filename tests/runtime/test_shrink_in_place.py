"""A shrink whose receiving and retiring processors are hosted by one worker hands the keys
over in place, as growth does: no group rebalance, the staging store taking the receiving
processor's place, the retired store deleted, every record applied once. Real worker
process, real broker, producers writing through both steps."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from pathlib import Path

from streamkit.testing import create_topic, produce_json
from tests.runtime.jobs import (
    ROOT,
    Job,
    make_records,
    read_state,
    reference,
    steady_producer,
    wait_for_log,
    wait_until_committed,
)

APP = "tests.runtime.job_app:app"


def scale(job: Job, n: int) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "streamkit.cli", "scale", APP, "--processors", str(n), "--wait", "--timeout", "180"],
        cwd=ROOT, env=job.env(), capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_a_shrink_on_one_worker_hands_the_keys_over_without_a_rebalance(broker: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    job = Job(broker, f"sip-{tag}", create_topic(broker, f"sip-{tag}", 2), tmp_path / "state", processors=2)
    records = make_records(6000, 300)
    stop = threading.Event()
    writer = steady_producer(broker, job.topic, records[1500:], chunk=150, pause=0.1, stop=stop)
    try:
        worker = job.start_worker()
        wait_for_log(job, worker, "hosts processors")
        produce_json(broker, job.topic, records[:1500])
        wait_until_committed(job, 2, 1500)
        writer.start()
        assert "processor 2: takes over the keys of processor 0" in scale(job, 3)
        assert "processor 2: retires" in scale(job, 2)
        writer.join(120)
        wait_until_committed(job, 2, len(records))
    finally:
        stop.set()
        job.stop_all()
    assert [w.returncode for w in job.workers] == [0]
    log = job.log(worker)
    assert "processor 0 took over the keys of retiring processor 2 in place (no rebalance)" in log, log[-3000:]
    assert "processor 0's store was for 3 processors, the job has 2: replaced by its staging store" in log
    assert log.count("assigned processors") == 1, "a scale step went through a rebalance"
    assert not (job.state_dir / job.app / "processor-2").exists(), "the retired processor's store is left"
    state, _ = read_state(job, 2)  # fails if a key is in two processors' stores
    assert state == reference(records)
