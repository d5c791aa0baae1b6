"""Strays across more than one expansion: a plain producer writes into partitions that
stay reserved through a first expansion and are activated by a second. Every record is
applied once, on the processor owning its key; ``topics check`` exits 0 once the worker
caught up. Real worker processes, the real broker, real stores, and the producers our
users run (aiokafka's and confluent-kafka's default partitioners)."""

from __future__ import annotations

import re
import signal
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.runtime.jobs import Job, make_records, read_state, reference, wait_for_log
from tests.runtime.plain_producers import PARTITIONERS, plain_partition, produce_plain
from tests.runtime.test_strays import cli, counts, expand, layout_topic, wait_drained


@pytest.mark.parametrize("partitioner", PARTITIONERS)
def test_strays_written_between_two_expansions_are_all_forwarded(partitioner: str, broker: str, tmp_path: Path) -> None:
    topic = layout_topic(broker, 4, 8)
    job = Job(broker, f"strays2-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state")
    waves = [make_records(3000, 300, start=3000 * i) for i in range(3)]
    # the middle wave puts records into 6 and 7, still reserved after the first expansion
    assert {plain_partition(partitioner, k.encode(), 8) for k, _ in waves[1]} >= {6, 7}
    try:
        worker = job.start_worker()
        wait_for_log(job, worker, "hosts processors")
        # the expansions follow the writes at once: the worker learns of each while its
        # assignment still has the earlier layout, and sweeps 6 and 7 as it catches up
        produce_plain(partitioner, broker, topic, waves[0])
        expand(broker, topic, 6)
        produce_plain(partitioner, broker, topic, waves[1])
        expand(broker, topic, 8)
        produce_plain(partitioner, broker, topic, waves[2])
        wait_drained(job)
        checked = cli(job, "topics", "check", topic)
        status = cli(job, "status", "tests.runtime.job_app:app")
    finally:
        job.stop_all()
    assert all(w.returncode == 0 for w in job.workers), [job.log(w, 2000) for w in job.workers]
    state, _ = read_state(job, 4)  # fails if a key is in two processors' stores
    records = [r for wave in waves for r in wave]
    expected = reference(records)
    assert sum(v["n"] for v in state.values()) == len(records), status.stdout
    assert counts(state) == counts(expected)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "all forwarded" in checked.stdout, checked.stdout


def test_status_shows_the_strays_a_stuck_sweep_has_not_forwarded(broker: str, tmp_path: Path) -> None:
    """A sweep that does not move (its worker is stopped) leaves strays waiting in the
    reserved partitions: ``status`` shows how many per partition, and none once the
    worker goes on and forwards them."""
    topic = layout_topic(broker, 4, 8)
    job = Job(broker, f"stuck-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state")
    records = make_records(2000, 200)
    reserved = Counter(p for k, _ in records if (p := plain_partition("aiokafka", k.encode(), 8)) >= 4)
    try:
        worker = job.start_worker()
        wait_for_log(job, worker, "hosts processors")
        worker.send_signal(signal.SIGSTOP)
        try:
            produce_plain("aiokafka", broker, topic, records)
            stuck = cli(job, "status", "tests.runtime.job_app:app")
        finally:
            worker.send_signal(signal.SIGCONT)
        wait_drained(job)
        moving = cli(job, "status", "tests.runtime.job_app:app")
    finally:
        job.stop_all()
    assert all(w.returncode == 0 for w in job.workers), [job.log(w, 2000) for w in job.workers]
    for partition, n in reserved.items():
        assert re.search(rf"│ {topic} +│ +{partition} │ None .*│ {n} waiting +│", stuck.stdout), stuck.stdout
        assert re.search(rf"│ {topic} +│ +{partition} │ .*│ {n} forwarded +│", moving.stdout), moving.stdout
    assert " waiting" not in moving.stdout, moving.stdout
