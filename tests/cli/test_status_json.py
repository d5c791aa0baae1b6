"""`streamkit status APP --json`: the job as one JSON document, checked against a real
running job (two worker processes on the real broker, records placed by the topic's
layout, some failing into the dead letters), and the same document the dashboard serves
at /api/status."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from streamkit.layout.protocol import LayoutCoordinator
from streamkit.testing import produce_json
from tests.ports import listen_port
from tests.runtime.jobs import ROOT, Job, make_records

APP = "tests.runtime.job_app:app"
TOP_LEVEL = {
    "app", "group", "dead_letter_topic", "at", "job_epoch", "p0", "processor_count", "target", "scaling", "unsettled",
    "workers", "processors", "partitions", "dead_letters", "global_tables", "standbys", "standbys_short", "skipped",
    "autoscale",
}  # fmt: skip


def cli(job: Job, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamkit.cli", *args], cwd=ROOT, env=job.env(), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def status_json(job: Job, *args: str) -> dict[str, Any]:
    proc = cli(job, "status", APP, "--json", *args)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = orjson.loads(proc.stdout)  # one document, nothing else on stdout
    return doc


def wait_for(job: Job, check: Callable[[dict[str, Any]], bool], timeout: float = 90.0) -> dict[str, Any]:
    """The first `status --json` document that passes ``check``."""
    deadline = time.monotonic() + timeout
    while not check(doc := status_json(job)):
        assert all(w.poll() is None for w in job.workers), "a worker exited"
        assert time.monotonic() < deadline, f"not so after {timeout} s: {doc}"
    return doc


def test_status_json_is_the_running_job(broker: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    topic = f"sj-{tag}"
    job = Job(broker, f"sj-{tag}", topic, tmp_path / "state", processors=3)
    records = [(k, dict(v, fail=True) if v["seq"] % 50 == 3 else v) for k, v in make_records(1500, 150)]
    placed = [(k, v, lh_bucket(key_hash(k.encode()), 3, 3)) for k, v in records]
    per_partition = Counter(p for *_, p in placed)
    failed = sum(1 for _, v in records if v.get("fail"))

    async def create() -> None:
        async with LayoutCoordinator(broker) as co:
            await co.create(topic, 3, capacity=4)  # partition 3: reserved

    dashboard = None
    try:
        asyncio.run(create())
        workers = [job.start_worker(), job.start_worker()]
        # both workers in the group, each processor on one of them, before any record: none is handled twice
        wait_for(job, lambda d: len(d["workers"]) == 2 and not d["unsettled"])
        produce_json(broker, topic, placed)
        status_json(job, "--wait-caught-up", "90")  # committed; then the workers' next heartbeats say so too
        doc = wait_for(job, lambda d: sum(w["handled"] for w in d["workers"]) >= len(records))
        port = listen_port()
        dashboard = subprocess.Popen(
            [sys.executable, "-m", "streamkit.cli", "dashboard", APP, "--port", str(port)],
            cwd=ROOT, env=job.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        served = _api_status(port, dashboard)
        again = status_json(job)
    finally:
        if dashboard is not None:
            dashboard.terminate()
            dashboard.wait(30)
        job.stop_all()
    assert [w.returncode for w in job.workers] == [0, 0]

    assert set(doc) == TOP_LEVEL, sorted(doc)
    assert doc["autoscale"] is None, doc["autoscale"]  # no autoscaler ran for this app
    names = (job.app, f"streamkit-{job.app}", f"{job.app}-dead-letters")
    assert (doc["app"], doc["group"], doc["dead_letter_topic"]) == names, doc
    job_record = (doc["p0"], doc["processor_count"], doc["target"], doc["scaling"], doc["unsettled"])
    assert job_record == (3, 3, None, None, []), doc
    # workers: the two processes (their names carry their pids), running, the three processors between them
    by_pid = {int(w["worker"].rsplit("-", 2)[1]): w for w in doc["workers"]}
    assert set(by_pid) == {w.pid for w in workers}, doc["workers"]
    assert all(w["state"] == "running" and not w["failing"] for w in doc["workers"]), doc["workers"]
    assert sorted(p for w in doc["workers"] for p in w["processors"]) == [0, 1, 2], doc["workers"]
    assert sum(w["handled"] for w in doc["workers"]) == len(records), doc["workers"]
    assert sum(w["dead_letters"] for w in doc["workers"]) == failed, doc["workers"]
    assert any("asked to fail" in w["last_error"] for w in doc["workers"]), doc["workers"]
    # processors: each active on the worker that lists it
    hosts = {p: w["worker"] for w in doc["workers"] for p in w["processors"]}
    assert [(p["processor"], p["state"], p["hosted"], p["worker"]) for p in doc["processors"]] == [
        (pid, "active", True, hosts[pid]) for pid in range(3)
    ], doc["processors"]
    # partitions: every record committed; the reserved one there too, with its state
    parts = {p["partition"]: p for p in doc["partitions"] if p["topic"] == topic}
    assert sorted(parts) == [0, 1, 2, 3], doc["partitions"]
    for partition in range(3):
        p = parts[partition]
        assert (p["mode"], p["state"], p["committed"], p["high_watermark"], p["lag"]) == (
            "ReadWrite", "active", per_partition[partition], per_partition[partition], 0
        ), p  # fmt: skip
        assert p["processors"] == [partition] and p["keys"] == "all", p
    assert (parts[3]["mode"], parts[3]["state"], parts[3]["high_watermark"]) == ("None", "reserved", 0), parts[3]
    assert doc["dead_letters"] == {"handler": failed}, doc["dead_letters"]
    # the dashboard serves the same document
    assert set(served) == TOP_LEVEL, sorted(served)
    for key in ("app", "group", "p0", "processor_count", "unsettled", "dead_letters"):
        assert served[key] == again[key], (key, served[key], again[key])
    assert _rows(served) == _rows(again), (served, again)


def _rows(doc: dict[str, Any]) -> list[Any]:
    """What a look of an idle job must agree on."""
    return [
        [(w["worker"], w["state"], w["processors"], w["handled"], w["dead_letters"]) for w in doc["workers"]],
        [(p["processor"], p["state"], p["hosted"], p["worker"]) for p in doc["processors"]],
        [(p["topic"], p["partition"], p["state"], p["committed"], p["high_watermark"]) for p in doc["partitions"]],
    ]


def _api_status(port: int, dashboard: subprocess.Popen[bytes], timeout: float = 60.0) -> dict[str, Any]:
    """The dashboard's /api/status, once it answers 200."""
    deadline = time.monotonic() + timeout
    while True:
        assert dashboard.poll() is None, f"the dashboard exited with {dashboard.returncode}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=15) as answer:
                doc: dict[str, Any] = orjson.loads(answer.read())
                return doc
        except (urllib.error.URLError, ConnectionError):  # not listening yet, or a look failed (503)
            assert time.monotonic() < deadline, f"the dashboard did not answer on port {port} in {timeout} s"
            time.sleep(0.2)
