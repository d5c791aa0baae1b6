"""A worker that cannot take the partitions the group gives it (here: its app's state
directory is a file, so no store opens) stops with one line saying so, instead of staying
alive with nothing hosted or applied. Real worker process, the real broker."""

from __future__ import annotations

import uuid
from pathlib import Path

from streamkit.testing import create_topic, produce_json
from tests.runtime.jobs import Job, make_records


def test_a_worker_that_cannot_take_its_partitions_stops_with_one_line(broker: str, tmp_path: Path) -> None:
    topic = create_topic(broker, f"assign-{uuid.uuid4().hex[:8]}", 2)
    job = Job(broker, f"assign-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", 2)
    produce_json(broker, topic, make_records(50, 10))
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / job.app).write_text("not a directory")  # where the processors' stores would be
    try:
        worker = job.start_worker()
        worker.wait(120)
    finally:
        job.stop_all()
    log = job.log(worker)
    assert worker.returncode == 1, log[-3000:]
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "taking its partitions failed, so it stops" in errors[0], log[-3000:]
