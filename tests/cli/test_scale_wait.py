"""`streamkit scale APP --processors N --wait`: it returns once the job has settled, so
that `status` right after shows every processor active on a live worker and no retired
one left; at its timeout it says in one line what is still unsettled, and the same
command run again waits on. Real worker processes on the real broker."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson

from streamkit.testing import create_topic, produce_json
from tests.runtime.jobs import ROOT, Job, make_records, read_state, reference, wait_for_log, wait_until_committed

APP = "tests.runtime.job_app:app"


def cli(job: Job, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamkit.cli", *args], cwd=ROOT, env=job.env(), capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip


def scale(job: Job, n: int, *args: str) -> subprocess.CompletedProcess[str]:
    return cli(job, "scale", APP, "--processors", str(n), *args)


def status_json(job: Job) -> dict[str, Any]:
    proc = cli(job, "status", APP, "--json")
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = orjson.loads(proc.stdout)
    return doc


def assert_settled(doc: dict[str, Any], n: int) -> None:
    """Every processor of ``n`` active on exactly one running worker, none beyond ``n``."""
    running = {w["worker"]: w["processors"] for w in doc["workers"] if w["state"] == "running"}
    rows = [(p["processor"], p["state"], p["hosted"], p["worker"] in running) for p in doc["processors"]]
    assert rows == [(pid, "active", True, True) for pid in range(n)], doc["processors"]
    assert sorted(pid for pids in running.values() for pid in pids) == list(range(n)), running
    assert (doc["processor_count"], doc["target"], doc["scaling"], doc["unsettled"]) == (n, None, None, []), doc


def new_job(broker: str, tmp_path: Path) -> Job:
    tag = uuid.uuid4().hex[:8]
    return Job(broker, f"sw-{tag}", create_topic(broker, f"sw-{tag}", 2), tmp_path / "state", processors=2)


def test_scale_up_and_down_with_wait_then_status_shows_every_processor_active(broker: str, tmp_path: Path) -> None:
    job = new_job(broker, tmp_path)
    records = make_records(3000, 300)
    try:
        for _ in range(2):
            wait_for_log(job, job.start_worker(), "hosts processors")
        produce_json(broker, job.topic, records[:1500])
        wait_until_committed(job, 2, 1500)
        up = scale(job, 3, "--wait", "--timeout", "180")
        assert up.returncode == 0, up.stdout + up.stderr
        assert up.stdout.splitlines()[-1].startswith(f"job {job.app}: 3 processors, each active on a live worker")
        assert_settled(status_json(job), 3)
        produce_json(broker, job.topic, records[1500:])
        down = scale(job, 2, "--wait", "--timeout", "180")
        assert down.returncode == 0, down.stdout + down.stderr
        assert "processor 2: retires" in down.stdout, down.stdout
        assert_settled(status_json(job), 2)
        wait_until_committed(job, 2, len(records))
    finally:
        job.stop_all()
    assert [w.returncode for w in job.workers] == [0, 0]
    state, _ = read_state(job, 2)  # fails if a key is in two processors' stores
    assert state == reference(records)


def test_scale_wait_says_what_is_unsettled_at_its_timeout_and_waits_on_when_run_again(
    broker: str, tmp_path: Path
) -> None:
    job = new_job(broker, tmp_path)
    try:
        worker = job.start_worker()
        wait_for_log(job, worker, "hosts processors")
        produce_json(broker, job.topic, make_records(500, 50))
        wait_until_committed(job, 2, 500)
        worker.send_signal(signal.SIGSTOP)  # nobody bootstraps the new processor
        try:
            stuck = scale(job, 3, "--timeout", "3")
            busy = scale(job, 3, "--no-wait")
            again = subprocess.Popen(
                [sys.executable, "-m", "streamkit.cli", "scale", APP, "--processors", "3", "--timeout", "180"],
                cwd=ROOT, env=job.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert again.stdout is not None
            first = again.stdout.readline()  # what it waits on, said before the worker goes on
        finally:
            worker.send_signal(signal.SIGCONT)
        rest, errors = again.communicate(timeout=240)
        assert again.returncode == 0, first + rest + errors
        assert_settled(status_json(job), 3)
    finally:
        job.stop_all()
    lines = stuck.stderr.strip().splitlines()
    assert stuck.returncode == 1 and len(lines) == 1, stuck.stderr
    assert lines[0].startswith(
        f"error: job {job.app} has not settled after 3 s: scaling 2 -> 3 processors (processor 2 bootstraps"
    ), lines
    assert busy.returncode == 1 and "is already scaling from 2 to 3 processors" in busy.stderr, busy.stderr
    assert first == f"job {job.app} is scaling 2 -> 3 processors already; waiting for it\n", first
    assert rest.splitlines()[-1].startswith(f"job {job.app}: 3 processors, each active on a live worker"), rest
