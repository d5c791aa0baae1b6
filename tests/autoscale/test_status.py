"""The autoscaler's decisions where an operator looks: `streamkit status` (text and
``--json``), the dashboard in a real headless Chromium, and its gauges, all read from the
journal the controller writes to the broker (``streamkit.autoscale.journal``).

A job of one processor on one worker, and `streamkit autoscale --workers gauge --min 2`:
the controller decides a scale-out to 2 workers and 2 processors, publishes 2 on its
gauge, scales the job's processors live, and every view shows that decision with the
figures it used. A refused scale shows with the job's reason, and the holds after it say
the controller waits before trying again."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from streamkit.autoscale.controller import Controller, Gauge
from streamkit.autoscale.journal import JOURNAL_TOPIC, JournalWriter, controller_info, parse_entry
from streamkit.autoscale.policy import Limits, Policy
from streamkit.cli import CliError
from streamkit.connection import Connection
from streamkit.kafkaio import KafkaIO
from streamkit.loader import load_app
from tests.autoscale.test_step_load import _has_job, _topics
from tests.ops.test_live_scale import Dashboard
from tests.ports import listen_port
from tests.runtime.jobs import ROOT
from tests.runtime.scale_job import ScaleJob

SCREENSHOT = ROOT / ".bench" / "dashboard-autoscale.png"


def _status_json(job: ScaleJob) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "streamkit.cli", "status", "tests.runtime.scale_app:app", "--json"],
        cwd=ROOT, env=job.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = orjson.loads(result.stdout)
    return doc


def _until(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)
    return found


def _scaled_out(doc: dict[str, Any]) -> dict[str, Any] | None:
    shown = doc["autoscale"]
    outs = [d for d in (shown or {}).get("decisions", []) if d["action"] == "out" and d["workers"] == 2]
    return outs[0] if outs else None


def test_status_the_dashboard_and_the_gauges_show_what_the_autoscaler_decided(
    broker: str, tmp_path: Path, system_tool: Callable[[str, str], str]
) -> None:
    chromium, chromedriver = system_tool("chromium", "chromium"), system_tool("chromedriver", "chromium-driver")
    job = ScaleJob(broker, tmp_path, p0=1, partitions=2)
    asyncio.run(_topics(job))
    job.start_worker()
    metrics = listen_port()
    options = {"--workers": "gauge", "--min": "2", "--max": "3", "--metrics-port": str(metrics),
               "--interval": "0.5", "--window": "1"}  # fmt: skip
    cmd = [sys.executable, "-m", "streamkit.cli", "autoscale", "tests.runtime.scale_app:app"]
    cmd += [part for option in options.items() for part in option]
    log = tmp_path / "autoscale.log"
    board = Dashboard(job, chromium, chromedriver)
    controller = None
    try:
        _until("the job to start", lambda: asyncio.run(_job_started(job)))
        job.start_producer(50)
        controller = subprocess.Popen(cmd, cwd=ROOT, env=job.env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        doc = _until("status --json to show the scale-out", lambda: (d := _status_json(job)) and _scaled_out(d) and d)
        shown, out = doc["autoscale"], _scaled_out(doc)
        assert shown["running"] and shown["controller"]["workers"] == "gauge", shown
        assert (shown["controller"]["min"], shown["controller"]["max"]) == (2, 3), shown
        assert out["processors"] == 2 and out["why"] == "--min 2 workers", out  # (the load needs one)
        assert {"input/s", "applied/s", "lag", "busy"} <= set(out["figures"]), out
        assert {"lag", "lag_seconds", "input_rate", "applied_rate", "busy", "workers", "processors"} <= set(
            shown["inputs"]
        ), shown
        assert len(shown["history"]) >= 2 and shown["history"][-1]["applied_rate"] is not None, shown
        # the decision acted: the job went to 2 processors, the gauge asks for 2 workers
        _until("the job at 2 processors", lambda: _status_json(job)["processor_count"] == 2, 90)
        gauges = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read().decode()
        assert f'streamkit_autoscale_desired_workers{{app="{job.app}"}} 2.0' in gauges, gauges
        text = job.status()
        assert "autoscaler: workers by gauge 2..3, target utilization 0.7" in text, text
        assert "inputs: lag " in text and "  decision: " in text, text
        assert "autoscaler decisions" in text and " out " in text, text
        waiting = "waiting for the cluster to start workers"  # the gauge says 2: the cluster's turn
        _until("a hold for the cluster", lambda: _status_json(job)["autoscale"]["decision"]["why"].startswith(waiting))
        # the dashboard: the section, its chart over several looks, the decision in its table
        board.open()
        drawn = _until("the dashboard's autoscaler chart", lambda: _board(board), 60)
        assert "out" in drawn["table"] and "workers by gauge 2..3" in drawn["head"], drawn
        SCREENSHOT.parent.mkdir(exist_ok=True)
        board.driver.save_screenshot(str(SCREENSHOT))
        # a controller started again goes on from its journal: the gauge at the count decided
        controller.send_signal(signal.SIGTERM)
        assert controller.wait(30) == 0, log.read_text()[-3000:]
        again = tmp_path / "autoscale-again.log"
        controller = subprocess.Popen(cmd, cwd=ROOT, env=job.env, stdout=open(again, "w"), stderr=subprocess.STDOUT)
        resumed = "resumed from the journal: the gauge at 2 workers (decided out)"
        _until("the restarted controller to resume", lambda: resumed in again.read_text())
    finally:
        if controller is not None:
            controller.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                controller.wait(30)
        board.close()
        job.cleanup()
    assert controller.returncode == 0, log.read_text()[-3000:]
    assert "out: 2 workers, 2 processors" in log.read_text()


async def _job_started(job: ScaleJob) -> bool:
    async with KafkaIO(job.broker) as io:
        return await _has_job(job, io)


def _board(board: Dashboard) -> dict[str, Any] | None:
    found = board.driver.execute_script(
        "const a = window.streamkitDashboard.autoscale; return a && {points: a.points, decisions: a.decisions,"
        " canvases: document.querySelectorAll('#autoscale-chart canvas').length,"
        " head: document.getElementById('autoscale-head').textContent,"
        " table: document.getElementById('autoscale-decisions').textContent};"
    )
    return found if found and found["points"] >= 3 and found["decisions"] >= 1 and found["canvases"] else None


def test_a_refused_scale_shows_with_the_jobs_reason_and_the_controller_waits(broker: str, tmp_path: Path) -> None:
    """The controller's own loop (a real look at a real job through the broker) with the
    job's answer to its scale replaced by a refusal: status shows the refusal with its
    reason, and the decisions after it hold for the pause."""
    job = ScaleJob(broker, tmp_path, p0=1, partitions=2)
    asyncio.run(_topics(job))
    job.start_worker()
    reason = f"job {job.app!r} is already scaling from 1 to 3 processors; wait for it"

    async def refuse(n: int) -> None:
        raise CliError(reason)

    async def run() -> Controller:
        app = load_app("tests.runtime.scale_app:app")
        policy = Policy(Limits(2, 3, 1, 0.7, 60.0, 60.0, 30.0))
        about = controller_info("gauge", False, {"min": 2, "max": 3, "target_utilization": 0.7}, 0.3)
        journal = JournalWriter(Connection(job.broker))
        controller = Controller(app, Connection(job.broker), policy, Gauge(), refuse, interval=0.3, window=0.6,
                                say=lambda _: None, journal=journal, about=about)  # fmt: skip
        stop = asyncio.Event()
        running = asyncio.create_task(controller.run(stop))
        async with asyncio.timeout(90):
            while sum(d.why.startswith("the last scale was refused") for d in controller.decisions) < 2:
                await asyncio.sleep(0.1)
        stop.set()
        await running
        await journal.close()
        return controller

    try:
        _until("the job to start", lambda: asyncio.run(_job_started(job)))
        with _app_env(job):
            controller = asyncio.run(run())
        shown = _status_json(job)["autoscale"]
        text = job.status()
    finally:
        job.cleanup()
    assert controller.scales == 0
    refused = [d for d in shown["decisions"] if d["action"] == "refused"]
    assert refused and refused[0]["why"] == reason and refused[0]["workers"] == 2, shown
    assert shown["decision"]["action"] == "hold" and reason in shown["decision"]["why"], shown
    assert "refused" in text and "is already scaling from 1 to 3" in text, text


@contextlib.contextmanager
def _app_env(job: ScaleJob) -> Any:
    """The test app's environment in this process (``tests.runtime.scale_app`` reads it at import)."""
    import os

    saved = dict(os.environ)
    os.environ.update({k: v for k, v in job.env.items() if k.startswith(("SK_TEST_", "STREAMKIT_"))})
    sys.modules.pop("tests.runtime.scale_app", None)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        sys.modules.pop("tests.runtime.scale_app", None)


def test_a_journal_record_of_another_shape_is_refused_by_the_reader() -> None:
    """Anyone can write to the journal's topic: the strict decoder refuses what the
    controller would not write (the reader then skips, counts and says it once)."""
    controller = controller_info("gauge", False, {"min": 1, "max": 2, "target_utilization": 0.7}, 5.0)
    inputs = {"lag": 0, "lag_seconds": 0.0, "workers": 1, "processors": 1, "settled": True}
    good = {"app": "a", "at": 1.0, "controller": controller, "inputs": inputs, "decision": None}
    assert parse_entry(orjson.dumps(good)).app == "a"
    sideways = {"action": "sideways", "workers": 1, "processors": 1, "why": ""}
    for bad in (b"not json", b"[]", orjson.dumps({**good, "inputs": {"lag": "x"}}),
                orjson.dumps({**good, "decision": sideways}), orjson.dumps({**good, "decision": {"action": "out"}}),
                orjson.dumps({**good, "kind": "other"}), orjson.dumps({**good, "at": 1e300}),
                orjson.dumps({**good, "controller": {**controller, "interval": "soon"}}),
                orjson.dumps({**good, "controller": {}}),
                orjson.dumps({**good, "inputs": {**inputs, "input_rate": 1.0}})):  # fmt: skip
        try:
            parse_entry(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was taken for a journal record of {JOURNAL_TOPIC}")
