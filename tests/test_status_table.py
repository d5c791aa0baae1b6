"""What `status` says of processors that restore or bootstrap: the source, how far, the
rate and an ETA (pure: heartbeats built by hand; a real worker's restore heartbeats are
checked in tests/state/test_changelog_restore.py, a real bootstrap's in
tests/runtime/test_scaling.py)."""

from __future__ import annotations

import time

from rich.console import Console

from streamkit.cli.status import processors_table, rate_and_eta
from streamkit.runtime.jobmeta import JobLayout
from streamkit.runtime.status import WorkerStatus


def _render(job: JobLayout, statuses: list[WorkerStatus]) -> str:
    console = Console(width=200, record=True)
    console.print(processors_table(job, statuses))
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
    from collections import Counter

    import streamkit
    from streamkit.cli.status import standbys_table
    from streamkit.cli.status_view import Gathered, view

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
