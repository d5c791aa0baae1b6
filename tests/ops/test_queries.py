"""Queries of state by key, with two real worker processes on the real broker: any
worker answers for every key (forwarding to the one hosting the key's processor), with
the value the processor's store holds; an unknown table gets one line."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

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
