"""A record that only claims to be a forwarded stray (a plain producer's
``streamkit.stray.from``, no seal) is ordinary input: it is applied where it lies in
place, forwarded where it does not, and never makes a real copy look like a duplicate.
Before the seal, one forged ``0:1000`` made every real copy of partition 0's strays below
it a "duplicate": records lost. Real worker processes, the real broker."""

from __future__ import annotations

import uuid
from pathlib import Path

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from streamkit.layout.strays import STRAY_HEADER
from streamkit.testing import default_partition, produce_json, read_topic
from tests.runtime.jobs import Job, make_records, read_state, reference
from tests.runtime.test_strays import ACTIVE, CAPACITY, P0, counts, layout_topic, wait_drained


def test_a_forged_origin_header_loses_no_record(broker: str, tmp_path: Path) -> None:
    topic = layout_topic(broker, ACTIVE, CAPACITY)
    job = Job(broker, f"forged-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", P0)
    forged = make_records(400, 40)
    strays = make_records(2000, 200, start=400)
    assert {default_partition(k.encode(), CAPACITY) for k, _ in strays} == set(range(CAPACITY))
    # in place (where the layout puts the key), each claiming a high origin in partition 0, twice
    placed = [(k, v, lh_bucket(key_hash(k.encode()), ACTIVE, ACTIVE)) for k, v in forged]
    try:
        job.start_worker()
        for origin in (b"0:1000", b"0:1000", b"junk", b"0:5:not-a-seal"):
            produce_json(broker, topic, placed[:100], headers=[(STRAY_HEADER, origin)])
            placed = placed[100:]
        produce_json(broker, topic, strays)  # Kafka's partitioner: strays, in 0 among others
        wait_drained(job)
    finally:
        job.stop_all()
    assert all(w.returncode == 0 for w in job.workers), [job.log(w, 2000) for w in job.workers]
    state, _ = read_state(job, P0)
    assert counts(state) == counts(reference(forged + strays))
    assert read_topic(broker, f"{job.app}-dead-letters") == []
    assert "(its seal does not verify): handled as ordinary input" in job.log(job.workers[0])
