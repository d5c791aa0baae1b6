"""What `status` says of processors that restore or bootstrap: the source, how far, the
rate and an ETA (pure: heartbeats built by hand; a real worker's restore heartbeats are
checked in tests/state/test_changelog_restore.py, a real bootstrap's in
tests/runtime/test_scaling.py); and, with a real worker on the real broker, that it reads
at 80 columns: no name cut, drained and reserved partitions folded, a legend."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import orjson
from rich.console import Console

import streamkit
from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from streamkit.cli.status import processors_table, rate_and_eta
from streamkit.cli.status_view import Gathered, view
from streamkit.layout.protocol import LayoutCoordinator
from streamkit.runtime.jobmeta import JobLayout
from streamkit.runtime.status import WorkerStatus
from streamkit.testing import produce_json
from tests.runtime.jobs import ROOT, Job, make_records, wait_for_log, wait_until_committed


def _render(job: JobLayout, statuses: list[WorkerStatus]) -> str:
    console = Console(width=200, record=True)
    found = Gathered(statuses, {}, Counter(), job, {}, {}, Counter())
    console.print(processors_table(view(streamkit.App("app"), found)))
    return console.export_text()


def test_a_restoring_processor_shows_the_changelog_read_its_rate_and_eta() -> None:
    since = int((time.time() - 10) * 1000)  # 5,000 offsets in 10 s: 500/s, 15,000 left: 30 s
    worker = WorkerStatus("app", "w0", 1, "h", time.time(), True, processors={0: [("t", 0)]})
    worker.restoring = {1: {"at": 5000, "end": 20000, "since_ms": since}}
    shown = _render(JobLayout("app", 2, 2), [worker])
    row = next(line for line in shown.splitlines() if "restoring" in line)
    assert "from the changelog: offset 5,000 of 20,000" in row and "records/s, ETA 0:00:3" in row, shown


def test_a_bootstrap_says_whether_it_started_from_the_changelog() -> None:
    since = int((time.time() - 4) * 1000)
    worker = WorkerStatus("app", "w0", 1, "h", time.time(), True, processors={0: [("t", 0)], 1: [("t", 1)]})
    worker.joining = {2: {"t2": 900, "t1": 1000, "lag": 100, "replayed": 400, "seeded": 1, "since_ms": since}}
    shown = _render(JobLayout("app", 2, 2, target=3), [worker])
    row = next(line for line in shown.splitlines() if "bootstrapping" in line)
    assert "from the changelog, then the input: T2 900, T1 1,000, lag 100" in row and "ETA 0:00:01" in row, shown


def test_rate_and_eta() -> None:
    assert rate_and_eta(1000, 3000, 0, 10.0) == "100 records/s, ETA 0:00:30"
    assert rate_and_eta(0, 10, 0, 10.0) == "0 records/s, ETA -"
    assert rate_and_eta(500, 0, 0, 10.0) == "50 records/s"


def test_the_dead_letter_topic_is_not_broken_on_an_80_column_terminal() -> None:
    from streamkit.cli.status import dead_letters_table

    console = Console(width=80, record=True)
    console.print(dead_letters_table({"value-decode": 3}, "orders-demo-dead-letters"))
    assert "topic orders-demo-dead-letters" in console.export_text()


def test_connection_options_are_taken_after_the_sub_command() -> None:
    from streamkit.cli import hoist_connection_options

    argv = ["topics", "create", "T", "--client-config", "c.properties", "--partitions", "2", "--ssl-cafile=ca.pem"]
    assert hoist_connection_options(argv) == [
        "--client-config", "c.properties", "--ssl-cafile=ca.pem", "topics", "create", "T", "--partitions", "2",
    ]  # fmt: skip
    assert hoist_connection_options(["produce", "T", "--", "--client-config"]) == [
        "produce", "T", "--", "--client-config",
    ]  # fmt: skip


def test_status_lists_every_standby_and_the_processors_short_of_them() -> None:
    from streamkit.cli.status import standbys_table

    app = streamkit.App("app", standby_replicas=1)
    w0 = WorkerStatus("app", "w0", 1, "h", time.time(), True, processors={0: [("t", 0)], 1: [("t", 1)]})
    w1 = WorkerStatus("app", "w1", 2, "h", time.time(), True, processors={2: [("t", 2)]})
    w0.standbys = {2: {"position": 40, "lag": 0, "state": "warm"}}
    w1.standbys = {0: {"position": 10, "lag": 25, "state": "catching up"}}
    found = Gathered([w0, w1], {}, Counter(), JobLayout("app", 3, 3), {}, {}, Counter())
    shown = view(app, found)
    assert [(r["processor"], r["worker"], r["lag"], r["state"]) for r in shown.standbys] == [
        (0, "w1", 25, "catching up"),
        (2, "w0", 0, "warm"),
    ]
    assert shown.standbys_short == {1: 0}
    console = Console(width=200, record=True)
    console.print(standbys_table(shown, 1))
    text = " ".join(console.export_text().split())  # (the caption wraps at the table's width)
    assert "catching up" in text and "fewer standbys than standby_replicas=1: processors 1 (0 of 1)" in text, text


def test_status_reads_at_80_columns_and_folds_drained_and_reserved_partitions(broker: str, tmp_path: Path) -> None:
    """A real worker on a topic of capacity 8: 4 partitions, expanded to 6, records in all
    six (some failing), shrunk back to 4 and the drain finished: at COLUMNS=80 no line is
    wider, nothing is cut with an ellipsis, the worker's whole name is on one line, the
    drained partitions 4-5 and the reserved 6-7 fold into a line each (rows with --all),
    and a legend says what the labels mean."""
    topic, app = f"st80-{uuid.uuid4().hex[:8]}", f"orders-st80-{uuid.uuid4().hex[:8]}"
    job = Job(broker, app, topic, tmp_path / "state", processors=4)
    records = [(k, dict(v, fail=True) if v["seq"] % 100 == 7 else v) for k, v in make_records(1200, 120)]

    async def change(step: str) -> None:
        async with LayoutCoordinator(broker, ack_timeout=5.0) as co:
            if step == "create":
                await co.create(topic, 4, capacity=8)
            elif step == "expand":
                await co.expand(topic, 6)
            else:
                await co.shrink(topic, 4, delay=0)
                await co.finish_drain(topic, force=True)

    try:
        asyncio.run(change("create"))
        worker = job.start_worker()
        wait_for_log(job, worker, "hosts processors")
        asyncio.run(change("expand"))
        placed = [(k, v, lh_bucket(key_hash(k.encode()), 4, 6)) for k, v in records]
        assert {p for *_, p in placed} == set(range(6))
        produce_json(broker, topic, placed)
        wait_until_committed(job, 6, len(records))
        asyncio.run(change("shrink"))
        folded, unfolded = _status(job), _status(job, "--all")
        names = [w["worker"] for w in orjson.loads(_status(job, "--json").stdout)["workers"]]
    finally:
        job.stop_all()
    text, lines = folded.stdout, folded.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in text, text
    assert len(names) == 1 and any(names[0] in line for line in lines), text  # the whole name, on one line
    flat = " ".join(text.split())
    assert f"+ 2 drained partitions (all consumed): {topic}/4-5" in flat, text
    assert f"+ 2 reserved partitions (capacity not yet in use, nothing left to read): {topic}/6-7" in flat, text
    assert "(--all lists them)" in flat and "every row has keys all, IC ranges 0, strays none" in flat, text
    rows = {int(m[1]) for m in re.finditer(rf"^│ {topic}/(\d+) +│ ReadWrite +│", text, re.M)}
    assert rows == {0, 1, 2, 3} and not re.search(rf"│ {topic}/[4-7] ", text), text
    dead = [line for line in lines if line.startswith("│ handler")]
    assert len(dead) == 1 and int(dead[0].split("│")[2]) == sum(1 for _, v in records if v.get("fail")), text
    for label in ("failures in a row", "initial count", "mode", "committed", "high watermark"):
        assert re.search(rf"^{label}  +\S", text, re.M), (label, text)
    assert "processors (initial count 4, job epoch 1)" in text and "p0" not in text, text
    shown_all = unfolded.stdout
    assert all(len(line) <= 80 for line in shown_all.splitlines()), shown_all
    assert {int(m[1]) for m in re.finditer(rf"^│ {topic}/(\d+) +│ None +│", shown_all, re.M)} == {4, 5, 6, 7}, shown_all
    assert "drained partitions" not in shown_all, shown_all


def _status(job: Job, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "streamkit.cli", "status", "tests.runtime.job_app:app", *args],
        cwd=ROOT, env=job.env(COLUMNS="80"), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc
