"""A plain topic (no layout) written by confluent-kafka's default partitioner (CRC32):
with more processors than partitions, each partition is shared by key range, and a key
CRC32 put where murmur2 would not is in no sharer's range. It is forwarded to where
murmur2 places it, and applied once there. Real worker processes, the real broker."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from streamkit.testing import create_topic, default_partition
from tests.runtime.jobs import Job, make_records, read_state, reference, wait_for_log
from tests.runtime.plain_producers import crc32_partition, produce_plain
from tests.runtime.test_strays import cli, counts, wait_drained


def test_a_plain_topic_shared_by_three_processors_loses_no_record_of_a_crc32_producer(
    broker: str, tmp_path: Path
) -> None:
    topic = create_topic(broker, f"plain-{uuid.uuid4().hex[:8]}", 2)
    job = Job(broker, f"plain-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", processors=3)
    records = make_records(2000, 200)
    misplaced = sum(crc32_partition(k.encode(), 2) != default_partition(k.encode(), 2) for k, _ in records)
    assert misplaced > 500  # CRC32 and murmur2 disagree on about half the keys
    try:
        worker = job.start_worker()
        wait_for_log(job, worker, "hosts processors")
        produce_plain("confluent", broker, topic, records)
        wait_drained(job, capacity=2)
        status = cli(job, "status", "tests.runtime.job_app:app")
    finally:
        job.stop_all()
    assert all(w.returncode == 0 for w in job.workers), [job.log(w, 2000) for w in job.workers]
    state, _ = read_state(job, 3)  # fails if a key is in two processors' stores
    assert counts(state) == counts(reference(records))
    forwarded = sum(int(n) for n in re.findall(rf"│ {topic} +│ +\d │ plain .*│ (\d+) forwarded", status.stdout))
    assert forwarded == misplaced, status.stdout
