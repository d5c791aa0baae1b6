"""Queries of state by key, with two real worker processes on the real broker: any
worker answers for every key (forwarding to the one hosting the key's processor), with
the value the processor's store holds; an unknown table gets one line."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from streamkit.query import Client, QueryError
from streamkit.testing import create_topic, produce_json
from tests.ops.test_metrics import _free_port, _wait
from tests.runtime.jobs import ROOT, Job, make_records, reference
from tests.runtime.test_strays import wait_drained


def test_any_worker_answers_for_every_key_from_the_processor_that_owns_it(broker: str, tmp_path: Path) -> None:
    topic = create_topic(broker, f"queries-{uuid.uuid4().hex[:8]}", 2)
    job = Job(broker, f"queries-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", 2)
    ports = [_free_port(), _free_port()]
    records = make_records(1000, 40)
    expected = reference(records)
    try:
        for port in ports:
            job.start_worker(STREAMKIT_QUERY_PORT=str(port), STREAMKIT_QUERY_HOST="127.0.0.1")
        produce_json(broker, topic, records)
        wait_drained(job, capacity=2)
        urls = [f"http://127.0.0.1:{port}" for port in ports]

        async def ask_all() -> list[tuple[str, int, dict]]:
            out = []
            for url in urls:
                async with Client(url) as client:
                    for key in sorted(expected):
                        out.append((key, ports[urls.index(url)], await client.get("stats", key)))
            return out

        def answered() -> list[tuple[str, int, dict]] | None:  # once both workers have heartbeats with their URLs
            try:
                return asyncio.run(ask_all())
            except QueryError:
                return None

        answers = _wait("every key answered by both workers", answered)

        async def refused() -> str:
            async with Client(urls[0], retries=0) as client:
                with pytest.raises(QueryError) as exc:
                    await client.get("nope", "k1")
                return str(exc.value)

        unknown = asyncio.run(refused())
        shown = subprocess.run(
            [sys.executable, "-m", "streamkit.cli", "query", "tests.runtime.job_app:app", "stats", "k7"],
            cwd=ROOT, env=job.env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        job.stop_all()
    assert all(w.returncode == 0 for w in job.workers), [job.log(w, 2000) for w in job.workers]
    served_by = {}
    for key, _, answer in answers:
        assert answer["value"] == expected[key], (key, answer)
        served_by.setdefault(key, set()).add((answer["processor"], answer["worker"]))
    # each key answered by one processor on one worker, whichever worker was asked (forwarded)
    assert all(len(by) == 1 for by in served_by.values()), served_by
    assert len({worker for by in served_by.values() for _, worker in by}) == 2  # both workers own keys
    assert unknown.startswith("404") and "no table 'nope'" in unknown, unknown
    assert shown.returncode == 0 and '"processor"' in shown.stdout and str(expected["k7"]["n"]) in shown.stdout, (
        shown.stdout + shown.stderr
    )


def test_answers_during_a_live_scale_are_the_owning_stores_at_their_positions(broker: str, tmp_path: Path) -> None:
    """2 -> 3 -> 2 processors under load (the topic expanded from 2 to 4 partitions first),
    a client asking both workers for random keys all along: every answer equals the fold
    of the key's input records below the positions in the answer (never a retired
    owner's copy), and each is counted with its latency."""
    import random
    import threading
    import time

    from streamkit.kafkaio import KafkaIO
    from streamkit.testing import read_topic
    from tests.runtime.scale_job import KEYS, ScaleJob
    from tests.runtime.test_scaling import start

    job = ScaleJob(broker, tmp_path)
    ports = [_free_port(), _free_port()]
    answers: list[tuple[str, dict, float]] = []
    done = threading.Event()

    def ask_continuously() -> None:
        async def run() -> None:
            rng = random.Random(7)
            while not done.is_set():
                port, key = rng.choice(ports), f"k{rng.randrange(KEYS)}"
                started = time.monotonic()
                try:
                    async with Client(f"http://127.0.0.1:{port}", retries=20) as client:
                        answer = await client.get("seen", key)
                except (QueryError, OSError):
                    await asyncio.sleep(0.05)  # a worker not up yet
                    continue
                answers.append((key, answer, time.monotonic() - started))

        asyncio.run(run())

    starting, each_port = job.start_worker, iter(ports)

    def start_worker() -> Any:  # start() starts two workers: each gets its query port
        job.env.update(STREAMKIT_QUERY_PORT=str(next(each_port)), STREAMKIT_QUERY_HOST="127.0.0.1")
        return starting()

    job.start_worker = start_worker  # type: ignore[method-assign]

    async def scenario() -> None:
        async with KafkaIO(broker) as io:
            await start(job, io)
            for n in (3, 2):
                assert (await asyncio.to_thread(job.scale, "--processors", str(n))).returncode == 0
                await job.wait_growth(io, 400)
            await job.finish(io)
        job.stop_workers()

    asker = threading.Thread(target=ask_continuously)
    asker.start()
    try:
        asyncio.run(scenario())
    finally:
        done.set()
        asker.join(60)
        job.cleanup()
    records: dict[str, list[tuple[int, int, dict]]] = {}
    for r in read_topic(broker, job.topic):
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
    latencies = sorted(t for _, _, t in answers)
    print(f"{len(answers)} answers, p50 {latencies[len(latencies) // 2] * 1000:.1f} ms, "
          f"p99 {latencies[int(len(latencies) * 0.99)] * 1000:.1f} ms")  # fmt: skip
    assert len(answers) > 100 and not wrong, (len(answers), wrong[:3])
    assert len({a["processor"] for _, a, _ in answers}) == 3  # the joined processor answered too


def test_a_query_port_in_use_stops_the_worker_with_one_line(broker: str, tmp_path: Path) -> None:
    import socket

    topic = create_topic(broker, f"queries-{uuid.uuid4().hex[:8]}", 1)
    job = Job(broker, f"queries-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", 1)
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        worker = job.start_worker(STREAMKIT_QUERY_PORT=str(taken.getsockname()[1]))
        try:
            worker.wait(60)
        finally:
            job.stop_all()
    assert worker.returncode not in (0, None), job.log(worker, 2000)
    errors = [line for line in job.log(worker).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "address already in use" in errors[0], job.log(worker, 2000)
