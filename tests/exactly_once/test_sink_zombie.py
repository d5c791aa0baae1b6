"""A zombie's sink rows: a worker paused (SIGSTOP) in a checkpoint, right after its zombie
check, while another takes its processor over, resumes and writes that checkpoint's rows.
The new owner claimed the processor's writer in the sink before it read the state, so the
sink refuses them and the zombie drops its checkpoint; before, the zombie's batch took the
number the new owner gave its own next batch, which the sink then skipped as held: its
rows were lost. In PostgreSQL and in Delta."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from tests.exactly_once.sink_jobs import Feed, pg_rows
from tests.runtime.jobs import Job, wait_for_log


@pytest.mark.parametrize("kind", ["postgres", "delta"])
def test_a_zombies_sink_rows_are_refused_and_the_new_owners_are_all_written(
    broker: str, topic_factory: Callable[..., str], tmp_path: Path, postgres: str, kind: str
) -> None:
    source, out = topic_factory(1, prefix="zsink-in"), topic_factory(1, prefix="zsink-out")
    run = source.rsplit("-", 1)[-1]
    table, pause, paused = f"zsink_{run}", tmp_path / "pause", tmp_path / "paused"
    delta = tmp_path / "rows.delta"
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint, k text)")
    env = {"SK_OUT": out, "SK_PG": postgres, "SK_PG_TABLE": table, "SK_PAUSE_FLAG": str(pause),
           "SK_PAUSED": str(paused), "SK_DELTA": str(delta) if kind == "delta" else ""}  # fmt: skip
    spec = "tests.exactly_once.sink_job_app:app"
    machine_a = Job(broker, f"zsink-{run}", source, tmp_path / "a" / "state", processors=1, app_spec=spec)
    machine_b = Job(broker, f"zsink-{run}", source, tmp_path / "b" / "state", processors=1, app_spec=spec)

    def rows() -> tuple[int, int]:
        if kind == "delta":
            try:
                written = DeltaTable(str(delta))
            except TableNotFoundError:  # (not written yet, or its first commit under way)
                return 0, 0
            ids = written.to_pyarrow_table(columns=["id"]).column("id").to_pylist()
            return len(ids), len(set(ids))
        return pg_rows(postgres, table)

    producer = Feed(broker, source)
    try:
        zombie = machine_a.start_worker(**env)
        producer.start()
        deadline = time.monotonic() + 90
        while rows()[0] < 200:
            assert time.monotonic() < deadline and zombie.poll() is None, machine_a.log(zombie, 3000)
            time.sleep(0.2)
        pause.touch()  # its next checkpoint stops right after its zombie check
        while not paused.exists():
            assert time.monotonic() < deadline and zombie.poll() is None, machine_a.log(zombie, 3000)
            time.sleep(0.05)
        owner = machine_b.start_worker(**env, SK_COMMIT="10")  # its first checkpoint after the zombie's
        wait_for_log(machine_b, owner, "hosts processors [0]", timeout=90)
        zombie.send_signal(signal.SIGCONT)
        wait_for_log(machine_a, zombie, "refused (its worker was paused through a rebalance)", timeout=60)
        time.sleep(2)
        producer.stop()
        sent, deadline = producer.sent, time.monotonic() + 90
        while rows()[1] < sent and time.monotonic() < deadline:
            time.sleep(0.3)
        total, distinct = rows()
        assert (total, distinct) == (sent, sent), f"{total} rows, {distinct} distinct ids, {sent} records sent"
        assert "dropping uncommitted state and rejoining" in machine_a.log(zombie)
    finally:
        producer.stop()
        machine_a.kill_all()
        machine_b.kill_all()
