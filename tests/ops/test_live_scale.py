"""One job under load scaled 2 -> 3 -> 2 processors live, watched from outside three
ways, as a team running it would: queries of random keys (every answer checked against
the input), each worker's Prometheus metrics (a bootstrapping processor, then an active
one), and the dashboard in a real headless Chromium (the lag chart drawn, the scale
step seen; a screenshot under ``.bench/``). Real worker processes, the real broker."""

from __future__ import annotations

import asyncio
import random
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from streamkit.kafkaio import KafkaIO
from streamkit.query import Client, QueryError
from streamkit.testing import read_topic
from tests.ports import listen_port
from tests.runtime.jobs import ROOT
from tests.runtime.scale_job import KEYS, ScaleJob
from tests.runtime.test_scaling import start

SCREENSHOT = ROOT / ".bench" / "dashboard.png"
STATE_LINE = re.compile(r'^streamkit_processor_state\{[^}]*processor="(\d+)",state="(\w+)"[^}]*\} 1\.0$', re.M)


class Asker(threading.Thread):
    """Asks both workers for random keys until stopped; keeps each answer and its latency."""

    def __init__(self, ports: list[int]) -> None:
        super().__init__()
        self.ports = ports
        self.answers: list[tuple[str, dict[str, Any], float]] = []
        self.done = threading.Event()

    def run(self) -> None:
        async def ask() -> None:
            rng = random.Random(7)
            while not self.done.is_set():
                port, key = rng.choice(self.ports), f"k{rng.randrange(KEYS)}"
                started = time.monotonic()
                try:
                    async with Client(f"http://127.0.0.1:{port}", retries=20) as client:
                        answer = await client.get("seen", key)
                except (QueryError, OSError):
                    await asyncio.sleep(0.05)  # a worker not up yet
                    continue
                self.answers.append((key, answer, time.monotonic() - started))

        asyncio.run(ask())


class StateWatcher(threading.Thread):
    """Scrapes both workers' metrics every 0.1 s: each processor's states in the order seen."""

    def __init__(self, ports: list[int]) -> None:
        super().__init__()
        self.ports = ports
        self.seen: dict[int, list[str]] = {}
        self.scrapes = 0
        self.errors: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.1):
            for port in self.ports:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                        text = answer.read().decode()
                except OSError as exc:  # a worker not up yet, or busy
                    self.errors.append(repr(exc))
                    continue
                self.scrapes += 1
                for pid, state in STATE_LINE.findall(text):
                    states = self.seen.setdefault(int(pid), [])
                    if not states or states[-1] != state:
                        states.append(state)


class Dashboard:
    """`streamkit dashboard` of the job, opened in a headless Chromium driven by Selenium."""

    def __init__(self, job: ScaleJob, chromium: str, chromedriver: str) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.port = listen_port()
        self.server = subprocess.Popen(
            [sys.executable, "-m", "streamkit.cli", "dashboard", "tests.runtime.scale_app:app", "--port",
             str(self.port)],
            cwd=ROOT, env=job.env, stdout=subprocess.DEVNULL, stderr=open(job.tmp / "dashboard.log", "wb"),
        )  # fmt: skip
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1500,1900"):
            options.add_argument(arg)
        self.driver = webdriver.Chrome(service=Service(chromedriver), options=options)

    def open(self) -> None:
        deadline = time.monotonic() + 30
        while True:  # the server may still be starting
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=2).close()
                break
            except OSError:
                assert self.server.poll() is None, "the dashboard server stopped"
                assert time.monotonic() < deadline, "the dashboard server did not start"
                time.sleep(0.2)
        self.driver.get(f"http://127.0.0.1:{self.port}/")

    def state(self) -> dict[str, Any]:
        return dict(
            self.driver.execute_script(
                "const s = window.streamkitDashboard; return {polls: s.polls, lagPoints: s.lagPoints,"
                " events: s.events.map(e => e[1]), canvases: document.querySelectorAll('#lag-chart canvas').length,"
                " error: document.getElementById('error').textContent};"
            )
        )

    def wait(self, what: str, check: Callable[[dict[str, Any]], bool], timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not check(shown := self.state()):
            assert time.monotonic() < deadline, f"the dashboard did not show {what} within {timeout} s: {shown}"
            time.sleep(0.2)
        return shown

    def close(self) -> None:
        self.driver.quit()
        self.server.terminate()
        self.server.wait(30)


def test_a_live_scale_watched_by_queries_metrics_and_the_dashboard(
    broker: str, tmp_path: Path, system_tool: Callable[[str, str], str]
) -> None:
    """2 -> 3 -> 2 processors under load (the topic expanded from 2 to 4 partitions first).
    Queries: every answer equals the fold of the key's input records below the positions
    in the answer (never a retired owner's copy), each counted with its latency. Metrics:
    the joining processor shows bootstrapping, then active. Dashboard: the lag chart draws,
    the scale step appears."""
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    job = ScaleJob(broker, tmp_path)
    # bootstraps and a shrink's staging store read the input (no changelog seed) at a bounded
    # rate: states that last seconds, which every scrape of the metrics can see
    job.env.update(STREAMKIT_CHANGELOG="false", STREAMKIT_BOOTSTRAP_RATE="1000")
    ports, metric_ports = [listen_port(), listen_port()], [listen_port(), listen_port()]
    asker, watcher = Asker(ports), StateWatcher(metric_ports)
    starting, each_port = job.start_worker, iter(zip(ports, metric_ports, strict=True))

    def start_worker() -> Any:  # start() starts two workers: each gets its query and metrics ports
        query, metrics = next(each_port)
        job.env.update(STREAMKIT_QUERY_PORT=str(query), STREAMKIT_QUERY_HOST="127.0.0.1",
                       STREAMKIT_METRICS_PORT=str(metrics))  # fmt: skip
        return starting()

    job.start_worker = start_worker  # type: ignore[method-assign]
    board: Dashboard | None = None
    shown: dict[str, Any] = {}

    async def scenario() -> None:
        async with KafkaIO(broker) as io:
            await start(job, io)
            if board is not None:
                await asyncio.to_thread(board.open)
                await asyncio.to_thread(board.wait, "the lag chart", lambda s: s["lagPoints"] >= 3 and s["canvases"])
            for n in (3, 2):
                assert (await asyncio.to_thread(job.scale, "--processors", str(n))).returncode == 0
                await job.wait_growth(io, 400)
                if board is not None and n == 3:
                    step = "the scale step"
                    shown.update(await asyncio.to_thread(board.wait, step, lambda s: _scaled_to(s, 3)))
                    SCREENSHOT.parent.mkdir(exist_ok=True)
                    await asyncio.to_thread(board.driver.save_screenshot, str(SCREENSHOT))
            await job.finish(io)
        job.stop_workers()

    asker.start()
    watcher.start()
    try:
        if chromium and chromedriver:
            board = Dashboard(job, chromium, chromedriver)
        asyncio.run(scenario())
    finally:
        asker.done.set()
        watcher.done.set()
        asker.join(60)
        watcher.join(60)
        if board is not None:
            board.close()
        job.cleanup()
    _check_answers(job, asker.answers)
    # the joining processor (2) bootstrapped, then served; at the shrink, one took its keys back
    seen = (watcher.seen, watcher.scrapes, watcher.errors[-3:])
    assert _then(watcher.seen.get(2, []), "bootstrapping", "active"), seen
    assert any(_then(s, "receiving", "active") for p, s in watcher.seen.items() if p < 2), seen
    if board is None:
        system_tool("chromium" if not chromium else "chromedriver", "chromium" if not chromium else "chromium-driver")
        return
    assert any("from 2 to 3 processors" in e for e in shown["events"]), shown
    assert not shown["error"], shown
    assert SCREENSHOT.stat().st_size > 10_000


def _then(states: list[str], first: str, then: str) -> bool:
    """``first`` was seen, and ``then`` after it."""
    return first in states and then in states[states.index(first) :]


def _scaled_to(shown: dict[str, Any], n: int) -> bool:
    return any(f"to {n} processors" in e for e in shown["events"])


def _check_answers(job: ScaleJob, answers: list[tuple[str, dict[str, Any], float]]) -> None:
    records: dict[str, list[tuple[int, int, dict[str, Any]]]] = {}
    for r in read_topic(job.broker, job.topic):
        assert r.key is not None and r.value is not None
        records.setdefault(r.key.decode(), []).append((r.partition, r.offset, orjson.loads(r.value)))
    wrong = []
    for key, answer, _ in answers:
        at = {int(tp.rsplit("/", 1)[1]): o for tp, o in answer["positions"].items() if tp.startswith(job.topic + "/")}
        expected: dict[str, list[int]] = {}
        for partition, offset, value in sorted(records.get(key, []), key=lambda x: x[2]["seq"]):
            if offset < at.get(partition, 0):
                count, _last = expected.get(value["p"], [0, -1])
                expected[value["p"]] = [count + 1, value["seq"]]
        got = {p: v[:2] for p, v in (answer["value"] or {}).items()}
        if got != expected:
            wrong.append((key, answer, expected))
    assert len(answers) > 100, f"{len(answers)} answers"
    latencies = sorted(t for _, _, t in answers)
    print(f"{len(answers)} answers, p50 {latencies[len(latencies) // 2] * 1000:.1f} ms, "
          f"p99 {latencies[int(len(latencies) * 0.99)] * 1000:.1f} ms")  # fmt: skip
    assert len(answers) > 100 and not wrong, (len(answers), wrong[:3])
    assert len({a["processor"] for _, a, _ in answers}) == 3  # the joined processor answered too
