"""The runtime end to end: real worker processes, the real broker, real RocksDB stores."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from streamkit.testing import create_topic, produce_json, read_topic
from tests.runtime.jobs import ROOT, Job, make_records, read_state, reference, wait_until_committed

PARTITIONS = 6
N = 100_000


def new_job(broker: str, tmp_path: Path, processors: int | None = 3) -> Job:
    tag = uuid.uuid4().hex[:8]
    topic = create_topic(broker, f"in-{tag}", PARTITIONS)
    return Job(broker, f"app-{tag}", topic, tmp_path / "state", processors)


def produce_in_chunks(job: Job, records: list, chunks: int) -> threading.Thread:
    """Produce `records` in `chunks` pieces from a thread, so workers see a live stream."""

    def run() -> None:
        size = len(records) // chunks + 1
        for i in range(0, len(records), size):
            produce_json(job.bootstrap, job.topic, records[i : i + size])

    t = threading.Thread(target=run)
    t.start()
    return t


def assert_exact(job: Job, records: list, processors: int = 3) -> None:
    state, positions = read_state(job, processors)
    assert state == reference(records)
    ends = {}
    for pos in positions.values():
        for (_, part), off in pos.items():
            ends[part] = max(ends.get(part, 0), off)
    assert sum(ends.values()) == len(records)


def test_three_workers_process_100k_records_exactly(broker: str, tmp_path: Path) -> None:
    job = new_job(broker, tmp_path)
    records = make_records(N, 1000)
    try:
        for _ in range(3):
            job.start_worker()
        producer = produce_in_chunks(job, records, 10)
        producer.join()
        wait_until_committed(job, PARTITIONS, N)
    finally:
        job.stop_all()
    assert all(w.returncode == 0 for w in job.workers), [job.log(w, 2000) for w in job.workers]
    assert_exact(job, records)


def test_sigkill_mid_stream_loses_nothing_and_applies_nothing_twice(broker: str, tmp_path: Path) -> None:
    job = new_job(broker, tmp_path)
    records = make_records(N, 1000)
    try:
        victim = job.start_worker()
        job.start_worker()
        job.start_worker()
        producer = produce_in_chunks(job, records, 20)
        wait_until_committed(job, PARTITIONS, N // 4)
        victim.send_signal(signal.SIGKILL)  # no checkpoint, no leave-group: just gone
        victim.wait()
        producer.join()
        wait_until_committed(job, PARTITIONS, N)  # the survivors took its processors over
    finally:
        job.stop_all()
    assert victim.returncode == -signal.SIGKILL
    assert_exact(job, records)


def test_workers_joining_and_leaving_mid_stream_keep_state_exact(broker: str, tmp_path: Path) -> None:
    job = new_job(broker, tmp_path)
    records = make_records(N, 1000)
    try:
        first = job.start_worker()
        producer = produce_in_chunks(job, records, 20)
        wait_until_committed(job, PARTITIONS, N // 5)
        job.start_worker(members=2)  # joins: two more members take processors over
        wait_until_committed(job, PARTITIONS, N // 2)
        first.send_signal(signal.SIGTERM)  # leaves cleanly mid-stream
        assert first.wait(30) == 0
        producer.join()
        wait_until_committed(job, PARTITIONS, N)
    finally:
        job.stop_all()
    assert_exact(job, records)


def test_restart_with_a_different_initial_processor_count_is_refused(broker: str, tmp_path: Path) -> None:
    job = new_job(broker, tmp_path, processors=3)
    records = make_records(1_000, 50)
    produce_json(broker, job.topic, records)
    try:
        job.start_worker()
        wait_until_committed(job, PARTITIONS, len(records))
    finally:
        job.stop_all()
    job.processors = 2
    refused = job.start_worker()
    assert refused.wait(60) == 1
    err = job.log(refused)
    assert f"job '{job.app}' was created with 3 processors" in err
    assert "processors=2" in err
    assert "Traceback" not in err


def test_bad_records_go_to_the_dead_letter_topic_and_good_ones_are_processed(broker: str, tmp_path: Path) -> None:
    job = new_job(broker, tmp_path)
    good = make_records(3_000, 100)
    bad_json = [("k-bad-json", b"{not json"), ("k-bad-json", b"\xff\xfe")]
    raising = [("k1", {"amount": 1, "seq": 10_000_000, "fail": True})]
    produce_json(broker, job.topic, good[:1000] + bad_json + good[1000:2000] + raising + good[2000:])
    total = len(good) + len(bad_json) + len(raising)
    try:
        job.start_worker()
        wait_until_committed(job, PARTITIONS, total)
    finally:
        job.stop_all()
    assert_exact_counts = reference(good)
    state, _ = read_state(job, 3)
    assert state == assert_exact_counts
    dead = read_topic(broker, f"{job.app}-dead-letters")
    assert len(dead) == 3
    by_reason: dict[str, list] = {}
    for rec in dead:
        h = {k: v.decode() for k, v in rec.headers}
        by_reason.setdefault(h["streamkit.error.reason"], []).append((rec, h))
        source = read_topic(broker, job.topic)
        original = [
            r
            for r in source
            if r.partition == int(h["streamkit.source.partition"]) and r.offset == int(h["streamkit.source.offset"])
        ]
        assert h["streamkit.source.topic"] == job.topic
        assert len(original) == 1 and original[0].value == rec.value and original[0].key == rec.key
    assert sorted(by_reason) == ["handler", "value-decode"]
    assert len(by_reason["value-decode"]) == 2
    assert all("JSONDecodeError" in h["streamkit.error.exception"] for _, h in by_reason["value-decode"])
    ((_, h),) = by_reason["handler"]
    assert h["streamkit.error.exception"] == "ValueError: asked to fail at seq 10000000"
    assert "count" in h["streamkit.error.handler"]


def test_a_handler_failing_on_every_record_is_loud_in_logs_and_status(broker: str, tmp_path: Path) -> None:
    job = new_job(broker, tmp_path)
    records = make_records(2_000, 100)
    produce_json(broker, job.topic, records)
    try:
        worker = job.start_worker(SK_TEST_FAIL_ALL="1", STREAMKIT_FAILURE_ALARM_AFTER="100")
        wait_until_committed(job, PARTITIONS, len(records))
        status = subprocess.run(
            [sys.executable, "-m", "streamkit.cli", "status", "tests.runtime.job_app:app"],
            env=job.env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        job.stop_all()
    assert status.returncode == 0, status.stderr
    assert "FAILING" in status.stdout
    dead_rows = [line.split("│") for line in status.stdout.splitlines() if line.startswith("│ handler")]
    assert [int(row[2]) for row in dead_rows] == [len(records)]
    log = job.log(worker)
    assert "records all failed" in log and "ValueError: asked to fail" in log


def test_one_line_errors_for_a_missing_topic_and_an_unreachable_broker(broker: str, tmp_path: Path) -> None:
    job = Job(broker, f"app-{uuid.uuid4().hex[:8]}", f"missing-{uuid.uuid4().hex[:8]}", tmp_path / "state", 3)
    missing = job.start_worker()
    assert missing.wait(60) == 1
    err = job.log(missing)
    assert f"topic '{job.topic}' does not exist" in err and "Traceback" not in err
    job.bootstrap = "127.0.0.1:1"
    unreachable = job.start_worker()
    assert unreachable.wait(60) == 1
    err = job.log(unreachable)
    assert "no Kafka broker answers at 127.0.0.1:1" in err and "Traceback" not in err
