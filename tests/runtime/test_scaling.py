"""Live processor scaling with real processes: workers, producers and `streamkit scale`
as separate processes on the real broker, the job growing 2 -> 3 -> 4 processors while
producers write without pause."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from stores.rocksdb import RocksDBStore
from streamkit.kafkaio import KafkaIO
from streamkit.layout.protocol import LayoutCoordinator
from tests.runtime.jobs import ROOT
from tests.runtime.test_layout_soak import wait_consumed, wait_growth

KEYS = 200
PRODUCERS = 2
WORKERS = 2


def scale_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamkit.cli", "scale", "tests.runtime.scale_app:app", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def test_scale_refusals(broker: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    env = dict(os.environ, SK_TEST_APP=f"sr-{tag}", SK_TEST_TOPIC=f"sr-{tag}", STREAMKIT_BROKER=broker,
               PYTHONPATH=str(ROOT))  # fmt: skip
    never = scale_cli(env, "--processors", "3")
    assert never.returncode == 1 and "has never run" in never.stderr

    async def record_job() -> None:
        from streamkit.runtime.jobmeta import resolve_job

        async with LayoutCoordinator(broker) as co:
            await co.create(f"sr-{tag}", 2, capacity=4)
        async with KafkaIO(broker) as io:
            await resolve_job(io, f"sr-{tag}", 2, 2)

    asyncio.run(record_job())
    below = scale_cli(env, "--processors", "1")
    assert below.returncode == 1 and "below its initial count 2" in below.stderr, below.stderr
    few = scale_cli(env, "--processors", "3")
    assert few.returncode == 1 and f"expand it first (streamkit topics expand sr-{tag} --partitions 3)" in few.stderr


@pytest.mark.soak
def test_processors_grow_live_with_exact_state_and_ordered_output(broker: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    topic, app = f"scale-{tag}", f"scale-{tag}"
    out = f"{topic}-out"
    group = f"streamkit-{app}"
    stop_file = tmp_path / "stop"
    env = dict(
        os.environ,
        SK_TEST_APP=app,
        SK_TEST_TOPIC=topic,
        SK_TEST_OUT=out,
        STREAMKIT_BROKER=broker,
        STREAMKIT_STATE_DIR=str(tmp_path / "state"),
        STREAMKIT_PROCESSORS="2",
        STREAMKIT_SESSION_TIMEOUT_MS="4000",
        STREAMKIT_HEARTBEAT_INTERVAL_MS="400",
        PYTHONPATH=str(ROOT),
    )
    producers: list[subprocess.Popen[bytes]] = []
    workers: list[subprocess.Popen[bytes]] = []
    scales: list[subprocess.CompletedProcess[str]] = []

    async def scenario() -> list[dict[str, Any]]:
        io = await KafkaIO(broker).start()
        coord = await LayoutCoordinator(broker, ack_timeout=5.0).start()
        try:
            await coord.create(topic, 2, capacity=4)
            await io.create_topic(out, 2)
            for i in range(WORKERS):
                workers.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "streamkit.cli",
                            "worker",
                            "tests.runtime.scale_app:app",
                            "--log-level",
                            "INFO",
                        ],
                        cwd=ROOT,
                        env=env,
                        stderr=open(tmp_path / f"w{i}.log", "wb"),
                    )  # fmt: skip
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
                            "300",
                            "--stop-file",
                            str(stop_file),
                        ],
                        cwd=ROOT,
                        env=env,
                        stdout=subprocess.PIPE,
                        stderr=open(tmp_path / f"p{i}.log", "wb"),
                    )  # fmt: skip
                )
            for p in producers:
                assert p.stdout is not None and p.stdout.readline().decode().startswith("ready")
            await wait_growth(io, group, topic, 2, 600, workers)
            await coord.expand(topic, 4)
            await wait_growth(io, group, topic, 4, 600, workers)
            for n in (3, 4):
                result = await asyncio.to_thread(scale_cli, env, "--processors", str(n))
                scales.append(result)
                assert result.returncode == 0, result.stdout + result.stderr
                await wait_growth(io, group, topic, 4, 600, workers)
            stop_file.write_bytes(b"")
            for p in producers:
                assert p.wait(30) == 0
            reports = [orjson.loads((tmp_path / f"p{i}.json").read_bytes()) for i in range(PRODUCERS)]
            await wait_consumed(io, group, topic, [0, 1, 2, 3], workers)
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
    assert all(w.returncode == 0 for w in workers)
    assert "processor 2: takes over the keys of processor 0" in scales[0].stdout, scales[0].stdout
    assert "processor 3: takes over the keys of processor 1" in scales[1].stdout, scales[1].stdout

    # state: exactly the whole stream applied once, per key on the processor that owns it
    expected: dict[str, dict[str, list[int]]] = {}
    for i, report in enumerate(reports):
        for k in range(min(KEYS, report["sent"])):
            seqs = range(k, report["sent"], KEYS)
            expected.setdefault(f"k{k}", {})[f"p{i}"] = [len(seqs), seqs[-1], 0]
    state: dict[str, Any] = {}
    for pid in range(4):
        with RocksDBStore.open(str(tmp_path / "state" / app / f"processor-{pid}"), ["seen"]) as store:
            for k, v in store.items("seen"):
                key = k.decode()
                assert key not in state, f"{key} is in two processors' stores"
                assert lh_bucket(key_hash(k), 2, 4) == pid, f"{key} left in processor {pid}'s store"
                state[key] = orjson.loads(v)
    assert state == expected

    # output: every input record's output exists, and each key's outputs keep the producers' order
    outputs: dict[tuple[str, str], list[int]] = {}

    async def read_out() -> list[Any]:
        async with KafkaIO(broker) as io:
            return await io.read_topic(out)

    for rec in asyncio.run(read_out()):
        v = orjson.loads(rec.value)
        outputs.setdefault((rec.key.decode(), v["p"]), []).append(v["seq"])
    for key, per in expected.items():
        for producer, (count, last, _) in per.items():
            seqs = outputs.get((key, producer), [])
            firsts = list(dict.fromkeys(seqs))
            assert len(firsts) == count and firsts[-1] == last, (key, producer, len(firsts), count)
            assert firsts == sorted(firsts), f"{key}/{producer}: outputs out of order"
    logs = "".join((tmp_path / f"w{i}.log").read_text() for i in range(WORKERS))
    assert logs.count("caught up") == 2 and "keys moved to new processors, deleted" in logs
