"""Standby replicas with real worker processes on separate disks (state directories),
the real broker and real stores: three workers, six processors, one standby each.

SIGKILL the worker hosting processor 0 under load, then another (at random, the one
hosting standbys included): each dead worker's processors go to the workers holding
their warm copies (promoted, not restored), the state per key equals processing every
record once, and each key's output comes in input order. Every other victim is paused
(SIGSTOP) through the failover and then resumed: a zombie, fenced, whose late changelog
writes no restore applies. A killed worker comes back on
an empty disk (a new machine): it warms copies up and only then takes processors over
(KIP-441's warm-up), never restoring one cold. The time from a kill to the
first output of the dead worker's keys is printed next to the session timeout."""

from __future__ import annotations

import asyncio
import os
import random
import re
import shutil
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from stores.rocksdb import RocksDBStore
from streamkit.kafkaio import KafkaIO
from streamkit.runtime.status import WorkerStatus, read_statuses
from streamkit.state.changelog import position_of
from streamkit.testing import create_topic, produce_json, read_topic
from tests.runtime.jobs import Job, make_records, reference, steady_producer, wait_until_committed

PROCESSORS, WORKERS = 6, 3
KILLS = int(os.environ.get("STREAMKIT_STANDBY_KILLS", "2"))
SESSION_MS = 3000
LAG = 300
"""The acceptable recovery lag: the test's changelogs are far smaller than the default's 10,000."""
MEMBER_RESTORE = re.compile(r"-m\d+: processor (\d+) restored from the changelog")
PROMOTED = re.compile(r"standby of processor (\d+) promoted")


def _statuses(broker: str, app: str) -> list[WorkerStatus]:
    async def look() -> list[WorkerStatus]:
        async with KafkaIO(broker) as io:
            return [s for s in await read_statuses(io, app) if s.alive]

    return asyncio.run(look())


def _wait_warm(
    broker: str, app: str, workers: set[int], timeout: float = 90, processors: int = PROCESSORS
) -> list[WorkerStatus]:
    """Until every processor is hosted by a live worker and has a warm standby on another."""
    deadline = time.monotonic() + timeout
    while True:
        live = [s for s in _statuses(broker, app) if s.pid in workers]
        hosts = {pid: s.worker for s in live for pid in s.processors}
        warm = {pid: s.worker for s in live for pid, st in s.standbys.items() if st["state"] == "warm"}
        if set(hosts) == set(range(processors)) and all(
            warm.get(pid, hosts[pid]) != hosts[pid] for pid in range(processors)
        ):
            return live
        assert time.monotonic() < deadline, f"no warm standby of every processor: hosts {hosts}, warm {warm}"
        time.sleep(0.3)


def _wait_warmed_up(broker: str, job: Job, worker: Any, timeout: float = 90) -> None:
    """Until ``worker`` (started on an empty disk) hosts processors, each taken over from
    a copy it warmed up (KIP-441's warm-up: no restore, so no output gap beyond a rebalance)."""
    deadline = time.monotonic() + timeout
    while not any(s.pid == worker.pid and s.processors for s in _statuses(broker, job.app)):
        assert time.monotonic() < deadline, f"the new worker took no processor: {job.log(worker, 3000)}"
        time.sleep(0.3)
    said = job.log(worker)
    assert "asks for a rebalance to take them over" in said, said[-3000:]
    assert not MEMBER_RESTORE.findall(said), f"the new worker restored a processor cold: {said[-3000:]}"


def _restored_state(broker: str, app: str, where: Path, processors: int = PROCESSORS) -> dict[str, dict[str, Any]]:
    """Per key, its state in every processor's store restored from the changelog alone (a
    zombie's late writes, of an older generation, are not on any chain)."""
    from streamkit.app import App
    from streamkit.state.changelog import changelog_topic
    from streamkit.state.restore import ChangelogSource, restore_store

    tables = App(app).table("stats", default=dict)  # the job's one table, as job_app declares it
    state: dict[str, dict[str, Any]] = {}

    async def restore_all() -> None:
        async with KafkaIO(broker) as io:
            for pid in range(processors):
                path = where / f"processor-{pid}"
                assert await restore_store(
                    ChangelogSource(io, changelog_topic(app), {"stats": tables}, processors), pid, path
                )
                with RocksDBStore.open(str(path), ["stats"], create=False) as store:
                    part = {k.decode(): orjson.loads(v) for k, v in store.items("stats")}
                assert not set(part) & set(state), f"processor {pid} restores keys of another"
                state.update(part)

    asyncio.run(restore_all())
    return state


def _final_state(dirs: list[Path], app: str, processors: int = PROCESSORS) -> dict[str, dict[str, Any]]:
    """Per key, its state in the furthest store of its processor among the disks (the last
    active's, or a copy as far as it)."""
    state: dict[str, dict[str, Any]] = {}
    for pid in range(processors):
        best: tuple[int, dict[str, Any]] | None = None
        for d in dirs:
            path = d / app / f"processor-{pid}"
            if not path.exists():
                continue
            with RocksDBStore.open(str(path), ["stats"], create=False) as store:
                at = position_of(store.checkpoint()) or -1
                if best is None or at > best[0]:
                    best = (at, {k.decode(): orjson.loads(v) for k, v in store.items("stats")})
        assert best is not None, f"processor {pid}: no store on any disk"
        twice = set(state) & set(best[1])
        assert not twice, f"keys {sorted(twice)[:5]} in processor {pid}'s store and another's"
        state.update(best[1])
    return state


def test_killed_workers_processors_go_on_from_their_standbys_exactly(broker: str, tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("STREAMKIT_KILL_SEED", "11")))
    tag = uuid.uuid4().hex[:8]
    topic, out = create_topic(broker, f"sb-{tag}", PROCESSORS), create_topic(broker, f"sb-out-{tag}", PROCESSORS)
    dirs = [tmp_path / f"disk{i}" for i in range(WORKERS)]
    job = Job(broker, f"sb-{tag}", topic, dirs[0], processors=PROCESSORS)
    env = {"STREAMKIT_STANDBY_REPLICAS": "1", "SK_TEST_OUT": out, "STREAMKIT_SESSION_TIMEOUT_MS": str(SESSION_MS),
           "STREAMKIT_HEARTBEAT_INTERVAL_MS": "300", "STREAMKIT_ACCEPTABLE_RECOVERY_LAG": str(LAG)}  # fmt: skip
    records = make_records(7800, 600)
    produce_json(broker, topic, records[:3000])
    on_disk = {}
    for d in dirs:
        w = job.start_worker(STREAMKIT_STATE_DIR=str(d), **env)
        on_disk[w.pid] = d
    stop = threading.Event()
    producer = steady_producer(broker, topic, records[3000:], 200, 0.4, stop)  # steady load through the kills
    waits = []
    try:
        wait_until_committed(job, PROCESSORS, 3000)
        producer.start()
        for kill in range(KILLS):
            live = _wait_warm(broker, job.app, {w.pid for w in job.workers if w.poll() is None})
            time.sleep(rng.uniform(0, 1))
            victim_status = (
                next(s for s in live if 0 in s.processors) if kill == 0 else rng.choice(live)
            )  # the first kill: processor 0's host; then any
            victim = next(w for w in job.workers if w.pid == victim_status.pid)
            lost = sorted(victim_status.processors)
            survivors = [w for w in job.workers if w is not victim and w.poll() is None]
            marks = {w.pid: len(job.log(w)) for w in survivors}
            zombie = kill % 2 == 1  # every other one is paused through the failover, then resumed
            if zombie:
                victim.send_signal(signal.SIGSTOP)
            else:
                victim.kill()
                victim.wait()
            t_kill = time.time()
            deadline = time.monotonic() + 60
            while True:  # each taken over from a warm copy: promoted, not restored
                since = {w.pid: job.log(w)[marks[w.pid] :] for w in survivors}
                promoted = {int(pid) for text in since.values() for pid in PROMOTED.findall(text)}
                restored = {int(pid) for text in since.values() for pid in MEMBER_RESTORE.findall(text)}
                assert not restored & set(lost), f"processors {restored} restored, not promoted: {since}"
                if set(lost) <= promoted:
                    break
                assert time.monotonic() < deadline, f"processors {lost} not all promoted: {since}"
                time.sleep(0.2)
            waits.append((lost, t_kill))
            if zombie:  # it wakes up fenced: nothing it writes now is applied anywhere
                victim.send_signal(signal.SIGCONT)
            elif kill < KILLS - 1:  # a new machine in its place: it warms copies up, then takes its share
                shutil.rmtree(on_disk[victim.pid])
                w = job.start_worker(STREAMKIT_STATE_DIR=str(on_disk[victim.pid]), **env)
                on_disk[w.pid] = on_disk[victim.pid]
                _wait_warmed_up(broker, job, w)
        producer.join()
        wait_until_committed(job, PROCESSORS, len(records), timeout=180)
    finally:
        stop.set()
        job.stop_all()
    for w in job.workers:
        assert w.returncode in (0, -9), job.log(w, 3000)

    assert _restored_state(broker, job.app, tmp_path / "verify") == reference(records)  # every record once
    assert _final_state(dirs, job.app) == reference(records)  # (the last actives' stores)
    outputs = read_topic(broker, out)
    firsts: dict[str, list[int]] = {}
    seen: set[int] = set()
    for r in outputs:
        seq = orjson.loads(r.value)["seq"]
        if seq not in seen:
            seen.add(seq)
            firsts.setdefault(r.key.decode(), []).append(seq)
    assert seen == {v["seq"] for _, v in records}  # every record's output, at least once
    assert all(s == sorted(s) for s in firsts.values()), "a key's output out of input order"
    by_partition = {r.partition: [] for r in outputs}
    for r in outputs:
        by_partition[r.partition].append(r.timestamp / 1000)
    for lost, t_kill in waits:  # reported, not asserted: the broker's failure detection dominates
        after = [t for pid in lost for t in by_partition.get(pid, []) if t >= t_kill]
        if not after:  # the load had ended
            continue
        first = min(after)
        print(f"kill of processors {lost}' host: their keys' output again after {first - t_kill:.2f} s "
              f"(session timeout {SESSION_MS / 1000:.1f} s)")  # fmt: skip


def test_standbys_follow_processor_scaling_two_three_two(broker: str, tmp_path: Path) -> None:
    """Three workers on their own disks, 2 -> 3 -> 2 processors under load: the new
    processor gets a warm standby, the retired one's copies go from every disk, and the
    state per key equals processing every record once."""
    tag = uuid.uuid4().hex[:8]
    topic = create_topic(broker, f"sbs-{tag}", 2)
    dirs = [tmp_path / f"disk{i}" for i in range(WORKERS)]
    job = Job(broker, f"sbs-{tag}", topic, dirs[0], processors=2)
    env = {"STREAMKIT_STANDBY_REPLICAS": "1", "STREAMKIT_SESSION_TIMEOUT_MS": str(SESSION_MS),
           "STREAMKIT_HEARTBEAT_INTERVAL_MS": "300", "STREAMKIT_ACCEPTABLE_RECOVERY_LAG": str(LAG)}  # fmt: skip
    records = make_records(6000, 500)
    produce_json(broker, topic, records[:2000])
    said = ""
    try:
        for d in dirs:
            job.start_worker(STREAMKIT_STATE_DIR=str(d), **env)
        wait_until_committed(job, 2, 2000)
        live = {w.pid for w in job.workers}
        _wait_warm(broker, job.app, live, processors=2)
        for span, processors in enumerate((3, 2), start=1):
            with ThreadPoolExecutor(1) as pool:  # written while the job scales
                writing = pool.submit(produce_json, broker, topic, records[span * 2000 : (span + 1) * 2000])
                said += job.scale(processors, **env)
                writing.result()
            wait_until_committed(job, 2, (span + 1) * 2000)
            _wait_warm(broker, job.app, live, processors=processors)  # processor 2 too, then not
        deadline = time.monotonic() + 60
        while any((d / job.app / "processor-2").exists() for d in dirs) or any(
            2 in s.standbys or 2 in s.processors for s in _statuses(broker, job.app)
        ):  # the retired processor's store and copies deleted on every disk
            assert time.monotonic() < deadline, [job.log(w, 2000) for w in job.workers]
            time.sleep(0.3)
    finally:
        job.stop_all()
    assert "processor 2: retires" in said, said
    assert any("standby of processor 2 kept here" in job.log(w) for w in job.workers)
    assert _final_state(dirs, job.app, 2) == reference(records)
