"""Random histories of a stateful job, for ``test_random_histories``: what to do (a pure
plan from a seed) and doing it with real processes (:func:`run_history`).

A history creates a topic (with or without reserved capacity), starts workers of the
per-key count app (``tests/runtime/job_app.py``), then takes steps: writes by
streamkit's producer, aiokafka's and confluent-kafka's (their default partitioners),
expansions, shrinks and finish-drains, worker restarts (SIGTERM), SIGKILLs, lost stores
(every worker stopped and the state directory removed), processor scale steps, and
waits until the group caught up. The plan keeps to what the layout allows (no
expansion while partitions drain, never below the initial counts) and the test broker
serves (it cannot add partitions: a topic without reserved capacity is never expanded).
A third of the histories run on a plain topic (no layout), never expanded either.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from streamkit.errors import TopicNotFoundError
from streamkit.kafkaio import KafkaIO
from streamkit.layout.protocol import LayoutCoordinator
from streamkit.producer import Producer
from streamkit.runtime.jobmeta import JobLayout, read_job
from streamkit.runtime.status import WorkerStatus, read_statuses
from streamkit.testing import create_topic, read_topic
from tests.runtime.jobs import ROOT, Job, read_state, reference, wait_for_log
from tests.runtime.plain_producers import PARTITIONERS, produce_plain

KEYS = 150
PRODUCERS = ("streamkit", *PARTITIONERS)
PLAIN = "plain"
"""A history's topic without a layout (created as any Kafka topic is)."""


@dataclass(frozen=True)
class Step:
    kind: str
    """produce, expand, shrink, finish-drain, restart, kill, lose-stores, scale, settle."""
    arg: Any = None
    """produce: (producer, records); expand/shrink: the new active count; scale: the new
    processor count; restart/kill: which live worker (an index, modulo their number)."""


@dataclass(frozen=True)
class History:
    seed: int
    n0: int
    capacity: int | str | None
    """Reserved capacity (None: none), or :data:`PLAIN`: no layout at all."""
    workers: int
    steps: tuple[Step, ...]

    def describe(self) -> str:
        steps = ", ".join(s.kind if s.arg is None else f"{s.kind} {s.arg}" for s in self.steps)
        return f"seed {self.seed}: {self.n0} partitions, capacity {self.capacity}, {self.workers} workers: {steps}"


def plan_history(seed: int, steps: int) -> History:
    """A random history of ``steps`` steps (and the writes and waits it must start and end with)."""
    rng = random.Random(seed)
    n0 = rng.choice((2, 3))
    capacity = rng.choice((None, 2 * n0, PLAIN))
    active, draining, processors = n0, False, n0
    most = capacity if isinstance(capacity, int) else n0  # the test broker cannot add partitions
    out = [Step("produce", (rng.choice(PARTITIONERS), rng.randrange(200, 600)))]
    for _ in range(steps):
        kinds = ["produce"] * 4 + ["restart", "kill", "settle", "lose-stores"]
        if not draining:
            kinds += ["expand"] * 2 if active < most else []
            kinds += ["shrink"] if active > n0 else []
            kinds += ["scale"]
        else:
            kinds += ["finish-drain"] * 2
        kind = rng.choice(kinds)
        if kind == "produce":
            out.append(Step(kind, (rng.choice(PRODUCERS), rng.randrange(100, 600))))
        elif kind == "expand":
            active = rng.randint(active + 1, min(most, active + 2))
            out.append(Step(kind, active))
        elif kind == "shrink":
            active, draining = active - 1, True
            out.append(Step(kind, active))
        elif kind == "finish-drain":
            draining = False
            out.append(Step(kind))
        elif kind == "scale":
            processors = rng.choice([q for q in range(n0, n0 + 3) if q != processors])
            out.append(Step(kind, processors))
        elif kind in ("restart", "kill"):
            out.append(Step(kind, rng.randrange(4)))
        else:
            out.append(Step(kind))
    if draining:
        out.append(Step("finish-drain"))
    out.append(Step("produce", (rng.choice(PRODUCERS), rng.randrange(100, 300))))
    return History(seed, n0, capacity, rng.choice((1, 2)), tuple(out))


@dataclass
class Run:
    """A history being run: the job, what was written, the layout's and the job's shape."""

    history: History
    job: Job
    physical: int
    processors: int
    records: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    killed: set[int] = field(default_factory=set)
    """Process ids of the workers SIGKILLed (their exit code is -9)."""
    stopped: set[int] = field(default_factory=set)
    """Process ids of the workers stopped on purpose (SIGTERM or SIGKILL)."""

    @property
    def group(self) -> str:
        return f"streamkit-{self.job.app}"

    def live(self) -> list[subprocess.Popen[bytes]]:
        return [w for w in self.job.workers if w.poll() is None]

    def check_workers(self, after: object) -> None:
        """Fail if a worker ended that was not stopped on purpose."""
        for w in self.job.workers:
            assert w.poll() is None or w.pid in self.stopped, (
                f"{self.history.describe()}: a worker exited with {w.returncode} after {after}: {self.job.log(w, 3000)}"
            )

    def terminate(self, workers: list[subprocess.Popen[bytes]], timeout: float = 60.0) -> None:
        """SIGTERM ``workers`` one after the other, each once the group is settled (before,
        a worker would die of the signal, or leave the group in the middle of a rebalance:
        the test broker then keeps it as the group's leader for ever, see
        docs/architecture.md, "Broker behaviours"), and wait until they exit."""
        for w in workers:
            self.wait_caught_up(offsets=False)
            self.stopped.add(w.pid)
            w.send_signal(signal.SIGTERM)
            w.wait(timeout)

    def kill(self, workers: list[subprocess.Popen[bytes]]) -> None:
        for w in workers:
            self.stopped.add(w.pid)
            self.killed.add(w.pid)
            w.send_signal(signal.SIGKILL)
            w.wait(60)

    def wait_caught_up(self, timeout: float = 120.0, *, offsets: bool = True) -> None:
        """Until, twice in a row, the group committed every partition, reserved ones too,
        up to its high watermark (forwarded copies land after their originals are read;
        ``offsets=False``: not asked) and the group is settled: no scale change under
        way, every live worker hosts processors and together they host ``0 .. p-1`` once
        each (a worker stopped in the middle of a handover leaves the received keys in a
        staging store, which its next start adopts)."""
        topic, parts, app = self.job.topic, range(self.physical), self.job.app

        async def look() -> tuple[dict[int, int], dict[int, int], JobLayout | None, list[WorkerStatus]]:
            async with KafkaIO(self.job.bootstrap) as io:
                hws, com = await io.high_watermarks(topic, parts), await io.committed(self.group, topic, parts)
                try:
                    statuses = await read_statuses(io, app)
                except TopicNotFoundError:  # no worker has sent a heartbeat yet
                    statuses = []
                return hws, com, await read_job(io, app), statuses

        deadline = time.monotonic() + timeout
        settled = 0
        while settled < 2:
            hws, com, job, statuses = asyncio.run(look())
            live = {w.pid for w in self.live()}
            hosting = {s.pid: sorted(s.processors) for s in statuses if s.pid in live and s.alive and s.processors}
            hosted = sorted(pid for pids in hosting.values() for pid in pids)
            placed = job is not None and job.target is None and hosted == list(range(job.p)) and set(hosting) == live
            caught_up = not offsets or all(com.get(p, 0) >= hw for p, hw in hws.items())
            settled = settled + 1 if caught_up and placed else 0
            self.check_workers("waiting to catch up")
            assert time.monotonic() < deadline, (
                f"{self.history.describe()}: not settled after {timeout} s: committed {com}, high watermarks {hws}, "
                f"job {job}, hosting {hosting} of live {sorted(live)}"
            )
            time.sleep(0.5)


def run_history(broker: str, tmp_path: Path, history: History) -> Run:
    """Run ``history`` with real processes; returns when every worker has stopped."""
    topic = f"hist-{uuid.uuid4().hex[:8]}"
    job = Job(broker, topic, topic, tmp_path / "state")
    capacity = history.capacity
    run = Run(history, job, capacity if isinstance(capacity, int) else history.n0, history.n0)
    if capacity == PLAIN:
        create_topic(broker, topic, history.n0)
    else:
        asyncio.run(_create(broker, topic, history.n0, capacity if isinstance(capacity, int) else None))
    try:
        for _ in range(history.workers):
            job.start_worker()
        for step in history.steps:
            if step.kind == "produce":
                producer, n = step.arg
                start = len(run.records)
                batch = [(f"k{(i * 7919) % KEYS}", {"amount": i % 97, "seq": i}) for i in range(start, start + n)]
                _produce(producer, broker, topic, batch)
                run.records += batch
            elif step.kind == "expand":
                asyncio.run(_expand(broker, topic, step.arg))
                run.physical = max(run.physical, step.arg)
            elif step.kind == "shrink":
                asyncio.run(_shrink(broker, topic, step.arg))
            elif step.kind == "finish-drain":
                while True:  # what the group has consumed to its end is given up
                    run.wait_caught_up()
                    if not asyncio.run(_finish_drain(broker, topic, run.group)):
                        break
            elif step.kind in ("restart", "kill"):
                live = run.live()
                worker = live[step.arg % len(live)]
                if step.kind == "kill":
                    run.kill([worker])
                else:
                    run.terminate([worker])
                job.start_worker()
            elif step.kind == "lose-stores":  # a dead machine: every processor rebuilt from history
                live = run.live()
                run.kill(live)
                shutil.rmtree(job.state_dir, ignore_errors=True)
                for _ in live:
                    job.start_worker()
            elif step.kind == "scale":  # once the job has started (it is refused before)
                wait_for_log(job, run.live()[0], "hosts processors")
                scaled = subprocess.run(
                    [sys.executable, "-m", "streamkit.cli", "scale", "tests.runtime.job_app:app",
                     "--processors", str(step.arg), "--timeout", "240"],
                    cwd=ROOT, env=job.env(), capture_output=True, text=True, timeout=300,
                )  # fmt: skip
                assert scaled.returncode == 0, f"{history.describe()}\n{scaled.stdout}{scaled.stderr}"
                run.processors = step.arg
            elif step.kind == "settle":
                run.wait_caught_up()
            run.check_workers(step)
        run.wait_caught_up()
        run.terminate(run.live())
    finally:
        job.stop_all(timeout=60)
    return run


def verify(run: Run) -> None:
    """Every record applied once, or dead-lettered (and then not applied); every key's
    state in one processor's store; every worker that was not killed left cleanly."""
    job, what = run.job, run.history.describe()
    logs = [job.log(w, 3000) for w in job.workers if w.pid not in run.killed and w.returncode != 0]
    assert not logs, f"{what}: workers did not exit cleanly: {logs}"
    dead = read_topic(job.bootstrap, f"{job.app}-dead-letters") if _exists(job, f"{job.app}-dead-letters") else []
    dead_seqs = {orjson.loads(r.value)["seq"] for r in dead if r.value}
    reasons = {dict(r.headers).get("streamkit.error.reason", b"?").decode() for r in dead}
    state, _ = read_state(job, run.processors)  # fails if a key is in two processors' stores
    expected = reference(r for r in run.records if r[1]["seq"] not in dead_seqs)
    got = {k: (v["n"], v["sum"]) for k, v in state.items() if v["n"]}
    want = {k: (v["n"], v["sum"]) for k, v in expected.items()}
    wrong = {k: (got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k)}
    applied = sum(n for n, _ in got.values())
    assert not wrong, (
        f"{what}: {len(wrong)} keys wrong (got, expected), e.g. {sorted(wrong.items())[:5]}; "
        f"{applied} applied + {len(dead_seqs)} dead-lettered ({sorted(reasons)}) of {len(run.records)} written"
    )


def _exists(job: Job, topic: str) -> bool:
    async def go() -> bool:
        async with KafkaIO(job.bootstrap) as io:
            return bool(await io.partition_count(topic))

    return asyncio.run(go())


def _produce(producer: str, broker: str, topic: str, records: list[tuple[str, dict[str, Any]]]) -> None:
    if producer != "streamkit":
        produce_plain(producer, broker, topic, records)
        return

    async def go() -> None:
        async with Producer(broker, client_id="history-producer") as p:
            for key, value in records:
                await p.send(topic, key, value)

    asyncio.run(go())


async def _create(broker: str, topic: str, n0: int, capacity: int | None) -> None:
    async with LayoutCoordinator(broker) as co:
        await co.create(topic, n0, capacity=capacity)


async def _expand(broker: str, topic: str, n: int) -> None:
    async with LayoutCoordinator(broker, ack_timeout=10.0) as co:
        await co.expand(topic, n)


async def _shrink(broker: str, topic: str, n: int) -> None:
    async with LayoutCoordinator(broker, ack_timeout=10.0) as co:
        await co.shrink(topic, n, delay=0)


async def _finish_drain(broker: str, topic: str, group: str) -> bool:
    """Give up what ``group`` consumed; whether partitions still drain."""
    async with LayoutCoordinator(broker) as co:
        layout, _, kept = await co.finish_drain(topic, groups=[group])
    return bool(kept)
