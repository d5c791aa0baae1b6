"""Records from elsewhere (mirrored from another cluster, whose epochs run higher and whose
headers come along, or forged) are no poison pill and never vanish:

- one stamped with a layout epoch the registry never reaches: the worker waits for the
  registry once, then dead-letters it with reason ``unknown-epoch`` and goes on; every
  good record after it is applied once, and a restart goes on too;
- one whose first header says it is a copy for compaction but that is not one (it names
  its own partition, or one its key is not placed in) is applied like any record.

Real worker processes, the real broker."""

from __future__ import annotations

import uuid
from pathlib import Path

from streamkit.layout.stamps import EPOCH_HEADER, stamp
from streamkit.testing import default_partition, produce_json, read_topic
from tests.runtime.jobs import Job, make_records, read_state, reference, wait_for_log
from tests.runtime.test_strays import counts, layout_topic, wait_drained

PARTITIONS = 2


def test_a_record_from_an_unknown_epoch_is_a_dead_letter_and_the_partition_goes_on(broker: str, tmp_path: Path) -> None:
    topic = layout_topic(broker, PARTITIONS, PARTITIONS)
    job = Job(broker, f"epochs-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", PARTITIONS)
    first, second = make_records(300, 30), make_records(300, 30, start=300)
    ours = [stamp(b"a1b2c3", 1)]  # what streamkit's producer writes at the topic's epoch
    forged = [("k-mirrored", {"amount": 1, "seq": -1}), ("k-mirrored", {"amount": 2, "seq": -2})]
    part = default_partition(b"k-mirrored", PARTITIONS)
    claims = [("k-claims-a-copy", {"amount": 3, "seq": -3}), ("k-claims-a-copy", {"amount": 4, "seq": -4})]
    here = default_partition(b"k-claims-a-copy", PARTITIONS)
    try:
        produce_json(broker, topic, first[:150], batch_headers=ours)
        produce_json(broker, topic, [(k, v, part) for k, v in forged[:1]], headers=[stamp(b"ffffff", 999_999)])
        produce_json(broker, topic, [(k, v, part) for k, v in forged[1:]], headers=[(EPOCH_HEADER, b"123456")])
        for named, record in zip((here, 1 - here), claims):  # its own partition; one its key is not placed in
            copy_header = [("sk.copy", str(named).encode()), *ours]
            produce_json(broker, topic, [(*record, here)], headers=copy_header)
        produce_json(broker, topic, first[150:], batch_headers=ours)
        worker = job.start_worker(STREAMKIT_LAYOUT_EPOCH_WAIT="1")
        wait_for_log(job, worker, "hosts processors")
        wait_drained(job, capacity=PARTITIONS, timeout=180)
        job.stop_all()
        assert worker.returncode == 0, job.log(worker, 3000)
        assert "its records are dead letters (reason unknown-epoch)" in job.log(worker)
        job.workers.clear()
        state, _ = read_state(job, PARTITIONS)
        # the records of an unknown epoch applied nowhere, those claiming to be copies applied
        assert counts(state) == counts(reference(first + claims))

        worker = job.start_worker(STREAMKIT_LAYOUT_EPOCH_WAIT="1")  # a restart goes on from there
        wait_for_log(job, worker, "hosts processors")
        produce_json(broker, topic, second, batch_headers=ours)
        wait_drained(job, capacity=PARTITIONS, timeout=180)
    finally:
        job.stop_all()
    assert all(w.returncode == 0 for w in job.workers), [job.log(w, 2000) for w in job.workers]
    state, _ = read_state(job, PARTITIONS)
    assert counts(state) == counts(reference(first + claims + second))
    dead = read_topic(broker, f"{job.app}-dead-letters")
    reasons = [dict(r.headers).get("streamkit.error.reason") for r in dead]
    assert reasons == [b"unknown-epoch", b"unknown-epoch"], reasons
    why = dict(dead[0].headers)["streamkit.error.exception"].decode()
    assert f"{topic}[{part}]@" in why and "layout epoch 999999" in why, why
