"""Stores restored from the job's changelog, with real worker processes, the real broker
and real stores: a state directory deleted while its worker is stopped, and workers
SIGKILLed at random moments (during checkpoints, and during restores) with their
disks lost half the time. The state per key always equals processing every record once,
and a restored processor reads the input from its last marker's positions, not below."""

from __future__ import annotations

import asyncio
import os
import random
import re
import shutil
import threading
import time
import uuid
from pathlib import Path

import pytest

from streamkit.kafkaio import KafkaIO
from streamkit.state.changelog import changelog_topic
from streamkit.testing import produce_json
from tests.runtime.jobs import Job, make_records, read_state, reference, steady_producer, wait_for_log
from tests.runtime.test_strays import counts, layout_topic, wait_drained

RESTORED = re.compile(r"processor (\d+) restored from the changelog in [\d.]+ s: (\d+) keys .*; input from (\{.*\})")
REBUILT = "rebuilding it from"


def _changelog_partitions(broker: str, app: str) -> int | None:
    async def look() -> int | None:
        async with KafkaIO(broker) as io:
            return await io.partition_count(changelog_topic(app))

    return asyncio.run(look())


def _restores_shown(broker: str, app: str) -> dict[int, dict[str, int]]:
    """Per processor, the last restore progress any heartbeat of ``app`` showed (what
    ``status`` reads)."""
    from streamkit.runtime.status import STATUS_TOPIC, decode_status

    async def look() -> dict[int, dict[str, int]]:
        async with KafkaIO(broker) as io:
            shown: dict[int, dict[str, int]] = {}
            for rec in await io.read_topic(STATUS_TOPIC):
                if (status := decode_status(rec.value, app)) is not None:
                    shown.update(status.restoring)
            return shown

    return asyncio.run(look())


def _restored(log: str) -> dict[int, dict[str, int]]:
    """Per processor restored in ``log``: the input positions its restore gave."""
    out = {}
    for m in RESTORED.finditer(log):
        out[int(m.group(1))] = {k: int(v) for k, v in re.findall(r"'([^']+)': (\d+)", m.group(3))}
    return out


@pytest.mark.parametrize("history", ["changelog", "none"])
def test_a_lost_disk_is_restored_from_the_changelog_without_reading_the_input_below_it(
    history: str, broker: str, tmp_path: Path
) -> None:
    """``none``: the first run is a job without a changelog (as every job before them);
    the second start gives it one (each store's snapshot), then the disk is lost."""
    topic = layout_topic(broker, 2, 2)
    job = Job(broker, f"restore-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", processors=2)
    first, second = make_records(3000, 300), make_records(2000, 300, start=3000)
    try:
        worker = job.start_worker(**({"STREAMKIT_CHANGELOG": "false"} if history == "none" else {}))
        wait_for_log(job, worker, "hosts processors")
        produce_json(broker, topic, first)
        wait_drained(job, capacity=2)
        if history == "none":
            job.stop_all()
            assert worker.returncode == 0, job.log(worker, 3000)
            assert _changelog_partitions(broker, job.app) is None, "a job without a changelog wrote one"
            worker = job.start_worker()  # with its changelog: the stores' snapshots at its checkpoints
            wait_for_log(job, worker, "hosts processors")
        job.stop_all()
        assert worker.returncode == 0, job.log(worker, 3000)
        job.workers.clear()  # done with
        shutil.rmtree(job.state_dir)  # the disk is gone
        produce_json(broker, topic, second)
        worker = job.start_worker()
        wait_drained(job, capacity=2)
        log = job.log(worker)
    finally:
        job.stop_all()
    assert worker.returncode == 0, job.log(worker, 3000)
    state, _ = read_state(job, 2)
    assert counts(state) == counts(reference(first + second))
    restored = _restored(log)
    assert sorted(restored) == [0, 1], log[-3000:]
    # the restores start the input where the first run's last checkpoint was: after every
    # record of the first wave, none of which was read again (no rebuild from the input)
    assert sum(o for positions in restored.values() for o in positions.values()) == len(first), restored
    assert REBUILT not in log, log[-3000:]
    # status showed each restore while it ran: the changelog read, against its end
    shown = _restores_shown(broker, job.app)
    assert sorted(shown) == [0, 1] and all(0 <= r["at"] <= r["end"] and r["end"] > 0 for r in shown.values()), shown


def test_workers_killed_at_random_moments_with_lost_disks_keep_the_state_exact(broker: str, tmp_path: Path) -> None:
    """SIGKILL under load, at random moments (in the middle of checkpoints, and of the
    restores that follow a lost disk), the state directory deleted after half of the
    kills: every record applied once."""
    rng = random.Random(int(os.environ.get("STREAMKIT_KILL_SEED", "7")))
    topic = layout_topic(broker, 2, 2)
    job = Job(broker, f"killed-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", processors=2)
    records = make_records(12000, 2000)
    stop = threading.Event()
    producer = steady_producer(broker, topic, records, 500, 0.2, stop)
    restores = 0
    try:
        worker = job.start_worker()
        wait_for_log(job, worker, "hosts processors")
        producer.start()
        for _ in range(int(os.environ.get("STREAMKIT_RESTORE_KILLS", "4"))):  # 4 in CI, more on demand
            time.sleep(rng.uniform(0.3, 2.5))
            worker.kill()
            worker.wait()
            job.workers.remove(worker)
            restores += job.log(worker).count("restored from the changelog")
            if rng.random() < 0.5:
                shutil.rmtree(job.state_dir / job.app, ignore_errors=True)
            worker = job.start_worker()
        producer.join()
        wait_drained(job, capacity=2, timeout=180)
        restores += job.log(worker).count("restored from the changelog")
    finally:
        stop.set()
        job.stop_all()
    assert job.workers[-1].returncode == 0, job.log(job.workers[-1], 3000)
    state, _ = read_state(job, 2)
    assert counts(state) == counts(reference(records))
    assert restores >= 1, "no kill was followed by a restore from the changelog"


def test_a_record_under_a_marker_key_that_streamkit_did_not_write_does_not_stop_a_restore(
    broker: str, tmp_path: Path
) -> None:
    """A plain producer's records under marker keys in the changelog (not JSON; JSON of
    the wrong shape): the restore skips them, says where, and restores the store exact
    from the well-formed markers; before, the restore raised inside the rebalance listener
    and the worker stayed alive applying nothing."""
    from streamkit.state.changelog import MARKER_PREFIX

    topic = layout_topic(broker, 2, 2)
    job = Job(broker, f"restore-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", processors=2)
    first, second = make_records(1000, 100), make_records(1000, 100, start=1000)
    changelog = changelog_topic(job.app)
    try:
        worker = job.start_worker()
        wait_for_log(job, worker, "hosts processors")
        produce_json(broker, topic, first)
        wait_drained(job, capacity=2)
        job.stop_all()
        assert worker.returncode == 0, job.log(worker, 3000)
        job.workers.clear()
        for partition in (0, 1):
            garbage = [(MARKER_PREFIX + b"forged", b"\x00\xffnot json"), (MARKER_PREFIX + b"x", b"[1]")]
            produce_json(broker, changelog, [(k, v, partition) for k, v in garbage])
        shutil.rmtree(job.state_dir)  # the disk is gone: both stores are restored through the garbage
        produce_json(broker, topic, second)
        worker = job.start_worker()
        wait_drained(job, capacity=2)
        log = job.log(worker)
    finally:
        job.stop_all()
    assert worker.returncode == 0, job.log(worker, 3000)
    state, _ = read_state(job, 2)
    assert counts(state) == counts(reference(first + second))
    assert sorted(_restored(log)) == [0, 1] and REBUILT not in log, log[-3000:]
    for partition in (0, 1):
        assert re.search(rf"skipping a malformed record in {changelog}\[{partition}\]@\d+: ", log), log[-3000:]
