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
from tests.ops.test_metrics import _wait
from tests.ports import listen_port
from tests.runtime.jobs import ROOT, Job, make_records, reference
from tests.runtime.test_strays import wait_drained


def test_any_worker_answers_for_every_key_from_the_processor_that_owns_it(broker: str, tmp_path: Path) -> None:
    topic = create_topic(broker, f"queries-{uuid.uuid4().hex[:8]}", 2)
    job = Job(broker, f"queries-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", 2)
    ports = [listen_port(), listen_port()]
    records = make_records(1000, 40)
    expected = reference(records)
    minute = 1_700_000_040_000  # a minute's start: the first half in that window, the second in the next
    halves = records[:500], records[500:]
    per_minute = {k: [(minute + 60_000 * i, sum(1 for r, _ in half if r == k)) for i, half in enumerate(halves)]
                  for k in expected}  # fmt: skip
    try:
        for port in ports:
            job.start_worker(STREAMKIT_QUERY_PORT=str(port), STREAMKIT_QUERY_HOST="127.0.0.1", SK_TEST_WINDOWS="1")
        for i, half in enumerate(halves):
            produce_json(broker, topic, half, timestamp_ms=minute + 60_000 * i + 7_000)
        wait_drained(job, capacity=2)
        urls = [f"http://127.0.0.1:{port}" for port in ports]

        last: list[Any] = []

        async def ask_all() -> list[tuple[str, int, dict]] | None:
            out = []
            for url in urls:
                async with Client(url) as client:
                    for key in sorted(expected):
                        answer = await client.get("stats", key)
                        windows = (await client.windows("per_minute", key))["windows"]
                        want = [(start, n) for start, n in per_minute[key] if n]
                        if answer["value"] != expected[key] or [(w["start"], w["value"]) for w in windows] != want:
                            last[:] = [url, key, answer, windows]  # a processor moved late and is catching up
                            return None
                        assert all(w["end"] == w["start"] + 60_000 for w in windows)
                        out.append((key, ports[urls.index(url)], answer))
            return out

        def answered() -> list[tuple[str, int, dict]] | None:  # once both workers have heartbeats with their URLs
            try:
                return asyncio.run(ask_all())
            except QueryError:
                return None

        # every key answered right by both workers (a rebalance after the input was drained
        # moves a processor, which answers from its store while it catches up)
        answers = _wait("every key answered right by both workers", answered, shown=lambda: last)

        async def refused() -> str:
            async with Client(urls[0], retries=0) as client:
                with pytest.raises(QueryError) as exc:
                    await client.get("nope", "k1")
                return f"{exc.value.status} {exc.value}"

        unknown = asyncio.run(refused())

        async def windowed_by_key() -> str:
            async with Client(urls[1], retries=0) as client:
                with pytest.raises(QueryError) as exc:
                    await client.get("per_minute", "k1")
                return f"{exc.value.status} {exc.value}"

        not_by_key = asyncio.run(windowed_by_key())
        shown = subprocess.run(
            [sys.executable, "-m", "streamkit.cli", "query", "tests.runtime.job_app:app", "stats", "k7"],
            cwd=ROOT, env=job.env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        shown_windows = subprocess.run(
            [sys.executable, "-m", "streamkit.cli", "query", "tests.runtime.job_app:app", "per_minute", "k7",
             "--windows"],
            cwd=ROOT, env=job.env(SK_TEST_WINDOWS="1"), capture_output=True, text=True, timeout=60,
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
    assert not_by_key.startswith("400") and "/tables/per_minute/KEY/windows" in not_by_key, not_by_key
    assert shown.returncode == 0 and '"processor"' in shown.stdout and str(expected["k7"]["n"]) in shown.stdout, (
        shown.stdout + shown.stderr
    )
    assert shown_windows.returncode == 0, shown_windows.stdout + shown_windows.stderr
    windows = orjson.loads(shown_windows.stdout)["windows"]
    assert [(w["start"], w["value"]) for w in windows] == [(s, n) for s, n in per_minute["k7"] if n], windows


def test_a_query_port_in_use_stops_the_worker_with_one_line(broker: str, tmp_path: Path) -> None:
    import socket

    topic = create_topic(broker, f"queries-{uuid.uuid4().hex[:8]}", 1)
    job = Job(broker, f"queries-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", 1)
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = job.start_worker(STREAMKIT_QUERY_PORT=str(port))
        try:
            worker.wait(60)
        finally:
            job.stop_all()
    assert worker.returncode not in (0, None), job.log(worker, 2000)
    errors = [line for line in job.log(worker).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "address already in use" in errors[0], job.log(worker, 2000)
    assert f"query_port={port}: cannot listen there" in errors[0], errors


def test_a_worker_that_serves_no_queries_does_not_load_the_http_stack() -> None:
    """aiohttp is imported when a worker starts serving queries (given a query port) or
    first forwards one: a worker without a query port runs without it (9 MB of its memory)."""
    probe = (
        "import sys, streamkit, streamkit.runtime.worker, streamkit.runtime.queries, streamkit.cli; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'aiohttp'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout
