"""A processor that comes back to a disk holding an older copy of its store, after its
later host died between a checkpoint's output (markers, sink rows) and its progress
record: the old copy is behind what was sent, so it is restored from the changelog rather
than brought forward from the input without output only up to the group's position (which
sent that checkpoint's output and sink rows a second time)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import orjson
import psycopg

from streamkit.exactly_once.reader import CommitGate
from streamkit.testing import read_topic
from tests.exactly_once.sink_jobs import Feed, pg_rows
from tests.runtime.jobs import Job


def test_a_processor_back_on_a_disk_with_an_older_store_sends_nothing_twice(
    broker: str, topic_factory: Callable[..., str], tmp_path: Path, postgres: str
) -> None:
    source, out = topic_factory(1, prefix="taken-in"), topic_factory(1, prefix="taken-out")
    run = source.rsplit("-", 1)[-1]
    table, flag = f"taken_{run}", tmp_path / "kill-at-step-3"
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint, k text)")
    env = {"SK_OUT": out, "SK_PG": postgres, "SK_PG_TABLE": table, "SK_KILL_FLAG": str(flag)}
    spec = "tests.exactly_once.sink_job_app:app"
    machine_a = Job(broker, f"taken-{run}", source, tmp_path / "a" / "state", processors=1, app_spec=spec)
    machine_b = Job(broker, f"taken-{run}", source, tmp_path / "b" / "state", processors=1, app_spec=spec)

    def rows() -> tuple[int, int]:
        return pg_rows(postgres, table)

    def wait_rows(n: int, job: Job) -> None:
        deadline = time.monotonic() + 90
        while rows()[0] < n:
            worker = job.workers[-1]
            assert time.monotonic() < deadline and worker.poll() is None, job.log(worker, 3000)
            time.sleep(0.2)

    producer = Feed(broker, source)
    try:
        producer.start()
        first = machine_a.start_worker(**env)
        wait_rows(300, machine_a)
        first.kill()  # machine A dies; its store stays on its disk
        first.wait()
        second = machine_b.start_worker(**env)  # takes the processor, restored from the changelog
        wait_rows(rows()[0] + 600, machine_b)
        flag.touch()  # B dies at step 3 of its next checkpoint: output sent, positions not recorded
        second.wait(60)
        assert not flag.exists(), machine_b.log(second, 3000)
        back = machine_a.start_worker(**env)  # machine A again, its older store on its disk
        wait_rows(rows()[0] + 300, machine_a)
        producer.stop()
        sent, deadline = producer.sent, time.monotonic() + 60
        while rows()[1] < sent and time.monotonic() < deadline:
            time.sleep(0.3)
        total, distinct = rows()
        assert (total, distinct) == (sent, sent), f"{total} rows, {distinct} distinct ids, {sent} records sent"
        gate = CommitGate()
        _, applied, _ = gate.admit((out, 0), [], read_topic(broker, out))
        once = Counter(orjson.loads(r.value)["i"] for r in applied)
        assert sorted(once) == list(range(sent)) and set(once.values()) == {1}
        assert "behind a later owner's checkpoint" in machine_a.log(back)
    finally:
        producer.stop()
        machine_a.kill_all()
        machine_b.kill_all()
