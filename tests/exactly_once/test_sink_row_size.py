"""Sink rows travel inside their checkpoint's changelog marker, one Kafka record: a
checkpoint is taken once the rows held reach a size, not only a count. At the default count
(5,000), rows of some 450 bytes made a record over the 1 MB limit, and the worker failed
at every checkpoint, for good."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from streamkit.errors import StreamkitError
from streamkit.sinks.outbox import ROW_BYTES_PER_CHECKPOINT, SinkOutbox, checkpoint_due
from streamkit.testing import produce_json
from tests.exactly_once.sink_jobs import pg_rows
from tests.runtime.jobs import Job


def test_rows_of_any_size_under_the_limit_reach_the_sink_at_the_default_count(
    broker: str, topic_factory: Callable[..., str], tmp_path: Path, postgres: str
) -> None:
    source, out = topic_factory(1, prefix="big-in"), topic_factory(1, prefix="big-out")
    run = source.rsplit("-", 1)[-1]
    table, n = f"big_{run}", 6_000
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint, k text, pad text)")
    produce_json(broker, source, [(f"k{i % 50}", {"i": i}) for i in range(n)])
    job = Job(broker, f"big-{run}", source, tmp_path / "state", processors=1,
              app_spec="tests.exactly_once.sink_job_app:app")  # fmt: skip
    worker = job.start_worker(SK_OUT=out, SK_PG=postgres, SK_PG_TABLE=table, SK_PAD="400")
    try:
        deadline = time.monotonic() + 90
        while True:
            found = pg_rows(postgres, table)
            if found[0] >= n or time.monotonic() > deadline or worker.poll() is not None:
                break
            time.sleep(0.3)
        assert worker.poll() is None, job.log(worker, 3000)
        assert tuple(found) == (n, n)
    finally:
        job.kill_all()


def test_a_checkpoint_is_due_by_the_rows_count_or_their_size() -> None:
    small, big = SinkOutbox("job/0", {}), SinkOutbox("job/1", {})
    for i in range(10):
        small.add("rows", {"id": i})
    assert checkpoint_due([small], 10) and not checkpoint_due([small], 11)
    row = {"pad": "x" * 1_000}
    while big.size + 1_000 < ROW_BYTES_PER_CHECKPOINT:
        big.add("rows", row)
    assert not checkpoint_due([big], 5_000)
    big.add("rows", row)
    big.add("rows", row)
    assert checkpoint_due([big], 5_000)
    big.committed()  # the rows went into the checkpoint: none held
    assert big.size == 0 and not checkpoint_due([big], 5_000)


def test_a_row_no_checkpoint_can_hold_or_that_is_not_json_is_refused_naming_its_sink() -> None:
    outbox = SinkOutbox("job/0", {})
    with pytest.raises(StreamkitError, match=r"sink 'rows': a row of 600,0\d\d bytes is more than a checkpoint holds"):
        outbox.add("rows", {"pad": "x" * 600_000})
    with pytest.raises(StreamkitError, match="sink 'rows': a row must be a dict of JSON values"):
        outbox.add("rows", {"at": object()})
    assert outbox.count() == 0
