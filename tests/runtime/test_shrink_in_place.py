"""A shrink whose receiving and retiring processors are hosted by one worker hands the keys
over in place, as growth does: no group rebalance, the staging store taking the receiving
processor's place, the retired store deleted, every record applied once; a shrink of two
steps takes both in place. Real worker process, real broker, producers writing through
every step."""

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


def test_shrinks_on_one_worker_hand_the_keys_over_without_a_rebalance(broker: str, tmp_path: Path) -> None:
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
        grown = scale(job, 4)  # two steps each way, every one in place
        assert "processor 2: takes over the keys of processor 0" in grown
        assert "processor 3: takes over the keys of processor 1" in grown
        shrunk = scale(job, 2)
        assert "processor 3: retires" in shrunk and "processor 2: retires" in shrunk
        writer.join(120)
        wait_until_committed(job, 2, len(records))
    finally:
        stop.set()
        job.stop_all()
    assert [w.returncode for w in job.workers] == [0]
    log = job.log(worker)
    for receiving, retiring in ((1, 3), (0, 2)):
        assert f"processor {receiving} took over the keys of retiring processor {retiring} in place" in log, log[-3000:]
        adopted = f"processor {receiving}'s store was for {retiring + 1} processors, the job has {retiring}: replaced"
        assert adopted in log
        assert not (job.state_dir / job.app / f"processor-{retiring}").exists(), "a retired processor's store is left"
    assert log.count("assigned processors") == 1, "a scale step went through a rebalance"
    state, _ = read_state(job, 2)  # fails if a key is in two processors' stores
    assert state == reference(records)
