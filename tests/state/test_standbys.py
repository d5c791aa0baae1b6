"""Standby replicas with real worker processes on separate disks (state directories),
the real broker and real stores: three workers, six processors, one standby each.

SIGKILL the worker hosting processor 0 under load, then another (at random, the one
hosting standbys included): each dead worker's processors go to the workers holding
their warm copies (promoted, not restored), the state per key equals processing every
record once, and each key's output comes in input order. The time from a kill to the
first output of the dead worker's keys is printed next to the session timeout."""

from __future__ import annotations

import asyncio
import os
import random
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from stores.rocksdb import RocksDBStore
from streamkit.kafkaio import KafkaIO
from streamkit.runtime.status import WorkerStatus, read_statuses
from streamkit.state.changelog import position_of
from streamkit.testing import create_topic, produce_json, read_topic
from tests.runtime.jobs import Job, make_records, reference, wait_until_committed

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


def _wait_warm(broker: str, app: str, workers: set[int], timeout: float = 90) -> list[WorkerStatus]:
    """Until every processor is hosted by a live worker and has a warm standby on another."""
    deadline = time.monotonic() + timeout
    while True:
        live = [s for s in _statuses(broker, app) if s.pid in workers]
        hosts = {pid: s.worker for s in live for pid in s.processors}
        warm = {pid: s.worker for s in live for pid, st in s.standbys.items() if st["state"] == "warm"}
        if len(hosts) == PROCESSORS and all(warm.get(pid, hosts[pid]) != hosts[pid] for pid in range(PROCESSORS)):
            return live
        assert time.monotonic() < deadline, f"no warm standby of every processor: hosts {hosts}, warm {warm}"
        time.sleep(0.3)


def _final_state(dirs: list[Path], app: str) -> dict[str, dict[str, Any]]:
    """Per key, its state in the furthest store of its processor among the disks (the last
    active's, or a copy as far as it)."""
    state: dict[str, dict[str, Any]] = {}
    for pid in range(PROCESSORS):
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
    records = make_records(9000, 600)
    produce_json(broker, topic, records[:3000])
    on_disk = {}
    for d in dirs:
        w = job.start_worker(STREAMKIT_STATE_DIR=str(d), **env)
        on_disk[w.pid] = d
    stop = threading.Event()

    def produce() -> None:  # steady load through the kills
        for i in range(3000, len(records), 200):
            if stop.is_set():
                return
            produce_json(broker, topic, records[i : i + 200])
            time.sleep(0.4)

    producer = threading.Thread(target=produce)
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
            if kill < KILLS - 1:  # it comes back, on the same disk
                w = job.start_worker(STREAMKIT_STATE_DIR=str(on_disk[victim.pid]), **env)
                on_disk[w.pid] = on_disk[victim.pid]
        producer.join()
        wait_until_committed(job, PROCESSORS, len(records), timeout=180)
    finally:
        stop.set()
        job.stop_all()
    for w in job.workers:
        assert w.returncode in (0, -9), job.log(w, 3000)

    assert _final_state(dirs, job.app) == reference(records)  # every record once, in order per key
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
