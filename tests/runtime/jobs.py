"""Driving real worker processes of tests/runtime/job_app.py and checking their state."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from stores.rocksdb import RocksDBStore

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Job:
    bootstrap: str
    app: str
    topic: str
    state_dir: Path
    processors: int | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: dict[int, Path] = field(default_factory=dict)
    """Each worker's log file, by process id."""
    app_spec: str = "tests.runtime.job_app:app"

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SK_TEST_APP=self.app,
            SK_TEST_TOPIC=self.topic,
            STREAMKIT_BROKER=self.bootstrap,
            STREAMKIT_STATE_DIR=str(self.state_dir),
            STREAMKIT_SESSION_TIMEOUT_MS="4000",
            STREAMKIT_HEARTBEAT_INTERVAL_MS="400",
            PYTHONPATH=str(ROOT),
        )
        if self.processors is not None:
            env["STREAMKIT_PROCESSORS"] = str(self.processors)
        env.update(extra)
        return env

    def start_worker(self, members: int = 1, **env: str) -> subprocess.Popen[bytes]:
        """A worker process logging at INFO into a file beside the state (:meth:`log`): a
        pipe nobody reads while the worker runs would stop it once full."""
        self.state_dir.parent.mkdir(parents=True, exist_ok=True)
        path = self.state_dir.parent / f"{self.app}-worker-{len(self.workers)}.log"
        with open(path, "wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "streamkit.cli",
                    "worker",
                    self.app_spec,
                    "--members",
                    str(members),
                    "--log-level",
                    "INFO",
                ],
                cwd=ROOT,
                env=self.env(**env),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.workers.append(proc)
        self.logs[proc.pid] = path
        return proc

    def scale(self, processors: int, **env: str) -> str:
        """``streamkit scale`` the job to ``processors``; what it said (it must succeed)."""
        result = subprocess.run(
            [sys.executable, "-m", "streamkit.cli", "scale", self.app_spec, "--processors", str(processors)],
            cwd=ROOT, env=self.env(**env), capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    def kill_at_random_moments(self, rng: Any, kills: int, before: int, **env: str) -> None:
        """Start a worker and SIGKILL it once the group has committed a random number of
        records (below ``before``) and a random moment more, ``kills`` times."""
        for _ in range(kills):
            worker = self.start_worker(**env)
            wait_until_committed(self, 2, rng.randrange(1, before))
            time.sleep(rng.random() * 0.5)
            worker.send_signal(signal.SIGKILL)
            worker.wait()

    def log(self, worker: subprocess.Popen[bytes], tail: int | None = None) -> str:
        """What ``worker`` has logged so far (its last ``tail`` characters)."""
        text = self.logs[worker.pid].read_text(errors="replace")
        return text if tail is None else text[-tail:]

    def stop_all(self, timeout: float = 30.0) -> None:
        for w in self.workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in self.workers:
            try:
                w.wait(timeout)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()

    def kill_all(self) -> None:
        for w in self.workers:
            if w.poll() is None:
                w.kill()
                w.wait()


def wait_for_log(job: Job, worker: subprocess.Popen[bytes], text: str, timeout: float = 60.0) -> None:
    """Until ``worker`` has logged ``text``; fail if it exits or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while text not in job.log(worker):
        assert worker.poll() is None, f"worker exited with {worker.returncode}: {job.log(worker, 3000)}"
        assert time.monotonic() < deadline, f"worker did not log {text!r} in {timeout} s: {job.log(worker, 3000)}"
        time.sleep(0.1)


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    async def run() -> dict[int, int]:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        await c.start()
        try:
            out = {}
            for p in range(partitions):
                out[p] = await c.committed(TopicPartition(topic, p)) or 0
            return out
        finally:
            await c.stop()

    return asyncio.run(run())


def wait_until_committed(
    job: Job, partitions: int, at_least: int, timeout: float = 120.0, total: bool = True, topic: str | None = None
) -> dict[int, int]:
    """Poll the group's committed offsets (of ``topic``, default the job's) until their sum
    reaches `at_least`; fail on a dead worker."""
    deadline = time.monotonic() + timeout
    while True:
        got = committed(job.bootstrap, f"streamkit-{job.app}", topic or job.topic, partitions)
        if sum(got.values()) >= at_least:
            return got
        for w in job.workers:
            if w.poll() not in (None, -signal.SIGKILL, 0):
                raise AssertionError(f"worker exited with {w.returncode}: {job.log(w, 3000)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"committed offsets stuck at {got} (< {at_least}) after {timeout}s\n{last_words(job)}")
        time.sleep(0.2)


def last_words(job: Job) -> str:
    """Stop the workers still running and return the end of every worker's log: what a
    stuck test shows (stopped first, so that each log ends with how its worker left)."""
    job.stop_all(timeout=20.0)
    return "\n".join(f"worker {i} (exit {w.returncode}): {job.log(w, 5000)}" for i, w in enumerate(job.workers))


def read_state(job: Job, processors: int) -> tuple[dict[str, dict[str, Any]], dict[int, dict[Any, int]]]:
    """Merge every processor's `stats` table; fail if a key is in two stores."""
    state: dict[str, dict[str, Any]] = {}
    positions: dict[int, dict[Any, int]] = {}
    for pid in range(processors):
        path = job.state_dir / job.app / f"processor-{pid}"
        store = RocksDBStore.open(str(path), ["stats"])
        try:
            positions[pid] = dict(store.checkpoint().positions)
            for k, v in store.items("stats"):
                key = k.decode()
                assert key not in state, f"key {key} is in two processors' stores"
                state[key] = orjson.loads(v)
        finally:
            store.close()
    return state, positions


def reference(records: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    ref: dict[str, dict[str, Any]] = {}
    for key, value in records:
        if value.get("fail"):
            continue
        s = ref.setdefault(key, {"n": 0, "sum": 0, "last": -1, "disorder": 0})
        s["n"] += 1
        s["sum"] += value["amount"]
        s["last"] = value["seq"]
    return ref


def make_records(n: int, keys: int, start: int = 0) -> list[tuple[str, dict[str, Any]]]:
    return [(f"k{(i * 7919) % keys}", {"amount": i % 97, "seq": i}) for i in range(start, start + n)]


def steady_producer(
    bootstrap: str, topic: str, records: list[tuple[str, dict[str, Any]]], chunk: int, pause: float,
    stop: threading.Event,
) -> threading.Thread:  # fmt: skip
    """A thread (not started) writing ``records`` in chunks of ``chunk`` with ``pause``
    seconds between them, until done or ``stop`` is set: a steady load through kills."""
    from streamkit.testing import produce_json

    def produce() -> None:
        for i in range(0, len(records), chunk):
            if stop.is_set():
                return
            produce_json(bootstrap, topic, records[i : i + chunk])
            time.sleep(pause)

    return threading.Thread(target=produce)
