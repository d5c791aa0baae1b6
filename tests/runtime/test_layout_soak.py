"""Live partition expansion and shrinking under a running stateful job (docs/design.md).

Real processes: three producer processes and three worker processes; the topic goes
4 -> 6 -> 8, shrinks 8 -> 5, drains, and grows to 7. At the end: no per-key
per-producer order violation, no record lost or applied twice, and every key's state is
in the store of the processor linear hashing gave it at the start (no state moved).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from assignors.murmur2 import key_hash
from assignors.placement import processor_for_hash
from stores.rocksdb import RocksDBStore
from streamkit.kafkaio import KafkaIO
from streamkit.layout.protocol import ChangeResult, LayoutCoordinator
from tests.runtime.jobs import ROOT

KEYS = 300
PRODUCERS = 3
WORKERS = 3


async def group_progress(
    io: KafkaIO, group: str, topic: str, partitions: range
) -> tuple[dict[int, int], dict[int, int]]:
    return await io.committed(group, topic, list(partitions)), await io.high_watermarks(topic, partitions)


async def wait_consumed(
    io: KafkaIO, group: str, topic: str, partitions: list[int], workers: list, timeout: float = 90
) -> None:
    """Until the group's committed offsets reach the high watermark of `partitions`."""
    deadline = time.monotonic() + timeout
    while True:
        committed, hws = await group_progress(io, group, topic, range(max(partitions) + 1))
        if all(committed.get(p, 0) >= hws[p] for p in partitions):
            return
        for w in workers:
            assert w.poll() is None, "a worker died"
        assert time.monotonic() < deadline, f"not consumed: committed {committed}, high watermarks {hws}"
        await asyncio.sleep(0.2)


async def wait_growth(io: KafkaIO, group: str, topic: str, parts: int, more: int, workers: list) -> None:
    """Until the group has committed `more` records beyond what it had (the job keeps up)."""
    start = sum((await io.committed(group, topic, list(range(parts)))).values())
    deadline = time.monotonic() + 60
    while sum((await io.committed(group, topic, list(range(parts)))).values()) < start + more:
        for w in workers:
            assert w.poll() is None, "a worker died"
        assert time.monotonic() < deadline, "the job made no progress"
        await asyncio.sleep(0.1)


@pytest.mark.soak
def test_expand_shrink_drain_expand_under_load_keeps_order_and_exact_state(broker: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    topic, app = f"soak-{tag}", f"soak-{tag}"
    group = f"streamkit-{app}"
    stop_file = tmp_path / "stop"
    env = dict(
        os.environ,
        SK_TEST_APP=app,
        SK_TEST_TOPIC=topic,
        STREAMKIT_BROKER=broker,
        STREAMKIT_STATE_DIR=str(tmp_path / "state"),
        STREAMKIT_SESSION_TIMEOUT_MS="4000",
        STREAMKIT_HEARTBEAT_INTERVAL_MS="400",
        PYTHONPATH=str(ROOT),
    )
    producers: list[subprocess.Popen[bytes]] = []
    workers: list[subprocess.Popen[bytes]] = []

    async def scenario() -> list[dict[str, Any]]:
        io = await KafkaIO(broker).start()
        coord = await LayoutCoordinator(broker, ack_timeout=5.0).start()
        try:
            await coord.create(topic, 4, capacity=12)
            for _ in range(WORKERS):
                workers.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "streamkit.cli",
                            "worker",
                            "tests.runtime.soak_app:app",
                            "--log-level",
                            "INFO",
                        ],
                        cwd=ROOT,
                        env=env,
                        stderr=open(tmp_path / f"w{len(workers)}.log", "wb"),
                    )
                )
            for i in range(PRODUCERS):
                producers.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "tests.runtime.soak_producer",
                            broker,
                            topic,
                            f"p{i}",
                            str(tmp_path / f"p{i}.json"),
                            "--keys",
                            str(KEYS),
                            "--rate",
                            "400",
                            "--stop-file",
                            str(stop_file),
                        ],
                        cwd=ROOT,
                        env=env,
                        stdout=subprocess.PIPE,
                        stderr=open(tmp_path / f"p{i}.log", "wb"),
                    )
                )
            ids = set()
            for p in producers:
                assert p.stdout is not None
                word, pid = p.stdout.readline().decode().split()
                assert word == "ready"
                ids.add(pid)

            def waited_for_all(result: ChangeResult) -> None:
                """Every producer runs throughout: each change must wait for and get all acks."""
                assert not result.fenced
                assert ids <= result.waited_for, (
                    f"epoch {result.layout.epoch} did not wait for {ids - result.waited_for}"
                )
                assert ids <= result.acked, f"epoch {result.layout.epoch} sealed without acks of {ids - result.acked}"

            await wait_growth(io, group, topic, 4, 1000, workers)
            for n in (6, 8):
                waited_for_all(await coord.expand(topic, n))
                await wait_growth(io, group, topic, n, 1000, workers)
            waited_for_all(await coord.shrink(topic, 5, delay=600))
            await wait_consumed(io, group, topic, [5, 6, 7], workers)
            _, given_up, kept = await coord.finish_drain(topic, groups=[group])
            assert sorted(given_up) == [5, 6, 7], kept
            await wait_growth(io, group, topic, 5, 1000, workers)
            waited_for_all(await coord.expand(topic, 7))  # grows again, re-using physical 5 and 6
            await wait_growth(io, group, topic, 7, 1000, workers)
            stop_file.write_bytes(b"")
            for p in producers:
                assert p.wait(30) == 0
            reports = [orjson.loads((tmp_path / f"p{i}.json").read_bytes()) for i in range(PRODUCERS)]
            await wait_consumed(io, group, topic, list(range(7)), workers)
            written: dict[tuple[str, int], list[tuple[int, int]]] = {}
            for part in range(8):
                for rec in (await io.read(topic, part, 0))[0]:
                    v = orjson.loads(rec.value)
                    written.setdefault((v["p"], v["seq"]), []).append((part, rec.offset))
            missing = sorted({(f"p{i}", n) for i, r in enumerate(reports) for n in range(r["sent"])} - set(written))
            assert not missing, f"the producers lost {len(missing)} acknowledged records, e.g. {missing[:5]}"
            twice = {k: v for k, v in written.items() if len(v) > 1}
            assert not twice, f"the producers wrote {len(twice)} records twice, e.g. {list(twice.items())[:3]}"
            dead = (await io.read(f"{app}-dead-letters", 0, 0))[0]
            assert not dead, f"{len(dead)} dead letters, e.g. {[(dict(r.headers), r.value) for r in dead[:2]]}"
            return reports
        finally:
            stop_file.write_bytes(b"")
            await coord.stop()
            await io.close()

    try:
        reports = asyncio.run(scenario())
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
        for p in producers:
            if p.poll() is None:
                p.kill()
    codes = [w.returncode for w in workers]  # -9: still running 30 s after SIGTERM
    tails = [(tmp_path / f"w{i}.log").read_text(errors="replace")[-3000:] for i, c in enumerate(codes) if c != 0]
    assert all(c == 0 for c in codes), (codes, tails)
    assert all(not r["fences"] for r in reports)

    expected: dict[str, dict[str, list[int]]] = {}
    for i, report in enumerate(reports):
        for n in range(report["sent"]):
            per = expected.setdefault(f"k{n % KEYS}", {})
            count, _, _ = per.get(f"p{i}", [0, -1, 0])
            per[f"p{i}"] = [count + 1, n, 0]
    state: dict[str, dict[str, list[int]]] = {}
    owner: dict[str, int] = {}
    for pid in range(4):  # p0 = n0 = 4 processors
        with RocksDBStore.open(str(tmp_path / "state" / app / f"processor-{pid}"), ["seen"]) as store:
            for k, v in store.items("seen"):
                assert k.decode() not in state, f"{k!r} in two stores"
                state[k.decode()] = orjson.loads(v)
                owner[k.decode()] = pid
    disorder = sum(c[2] for per in state.values() for c in per.values())
    assert disorder == 0, "per-key per-producer order violated"
    assert state == expected  # nothing lost, nothing applied twice
    # state follows keys: each key lives where linear hashing over p0 put it at the start
    assert all(owner[k] == processor_for_hash(key_hash(k.encode()), 4, 4) for k in owner)
    assert sum(r["sent"] for r in reports) > 5000
