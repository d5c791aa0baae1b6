"""Every kind of window in a real worker process, killed with SIGKILL again and again
while it works through a history of out-of-order, late and gapped records on the real
broker: the stores end with exactly the reference's windows (``reference``, per
partition: one processor each), every close the reference makes is sent with its final
value, no other, and a close sent twice only because a kill came before its checkpoint;
then a store restored from the changelog, and both rebuilt from the input history, hold
the same windows and send no close again. And ``close_on="wall"``: an idle key's window
closes and is sent with no further input."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from assignors.linear_hashing import partition_for_key
from stores.rocksdb import RocksDBStore
from stores.serde import serde_for
from streamkit.errors import TopicNotFoundError
from streamkit.testing import create_topic, read_topic, unique_topic_name
from streamkit.windows import WindowKeySerde
from tests.runtime.jobs import committed
from tests.windows import reference
from tests.windows.test_windows_driver import expected, history
from tests.windows.windows_app import KINDS

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 2
KILLS = int(os.environ.get("STREAMKIT_WINDOW_KILLS", "2"))  # 2 in CI, more on demand


async def produce(broker: str, topic: str, records: list[tuple[str, int, int]], partitions: int = PARTITIONS) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all", linger_ms=5)
    await producer.start()
    try:
        sent = [
            await producer.send(
                topic,
                orjson.dumps({"n": n}),
                key=key.encode(),
                timestamp_ms=ts,
                partition=partition_for_key(key.encode(), partitions, partitions),
            )  # fmt: skip
            for key, ts, n in records
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


class Worker:
    def __init__(self, broker: str, tmp: Path, app: str, topic: str, **env: str) -> None:
        self.tmp, self.app, self.runs = tmp, app, 0
        self.env = dict(
            os.environ, SK_WINDOW="all", SK_TEST_APP=app, SK_TEST_TOPIC=topic, STREAMKIT_BROKER=broker,
            STREAMKIT_STATE_DIR=str(tmp / "state"), STREAMKIT_PROCESSORS=str(PARTITIONS),
            STREAMKIT_SESSION_TIMEOUT_MS="3000", STREAMKIT_HEARTBEAT_INTERVAL_MS="300", PYTHONPATH=str(ROOT),
            SK_TEST_OUT=f"{app}-closes", **env,
        )  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.tmp / f"worker-{self.runs}.log", "wb")
        self.runs += 1
        cmd = [sys.executable, "-m", "streamkit.cli", "worker", "tests.windows.windows_app:app", "--log-level", "INFO"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return (self.tmp / f"worker-{self.runs - 1}.log").read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            assert self.proc is not None and self.proc.poll() is None, f"worker exited: {self.log()[-3000:]}"
            assert time.monotonic() < deadline, f"worker did not log {text!r}: {self.log()[-3000:]}"
            time.sleep(0.05)

    def stacks(self) -> str:
        """The worker's log since it started, its last lines the stack of every thread
        (SIGUSR1: what a stuck worker is doing)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        lines = self.log().splitlines()
        return "\n".join(line for line in lines if "acknowledged epoch" not in line)[-6000:]

    def wait_committed(self, broker: str, topic: str, partitions: int, count: int, timeout: float = 120) -> None:
        """Until the group committed ``count`` records of ``topic`` (the worker alive all along)."""
        deadline = time.monotonic() + timeout
        while sum((at := committed(broker, f"streamkit-{self.app}", topic, partitions)).values()) < count:
            assert self.proc is not None and self.proc.poll() is None, self.log()[-3000:]
            if time.monotonic() > deadline:
                raise AssertionError(f"stuck at {at} of {count}: {self.stacks()}")
            time.sleep(0.3)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(30)


def _read_if_any(broker: str, topic: str) -> list[Any]:
    """The records of ``topic``; none while it does not exist (the first send creates it)."""
    try:
        return read_topic(broker, topic)
    except TopicNotFoundError:
        return []


def sent_closes(broker: str, app: str) -> dict[tuple[str, str, int], list[int]]:
    """(kind, key, window start) -> the totals its closes were sent with, in order."""
    sent: dict[tuple[str, str, int], list[int]] = {}
    for rec in read_topic(broker, f"{app}-closes"):
        v = orjson.loads(rec.value)
        sent.setdefault((v["kind"], rec.key.decode(), v["start"]), []).append(v["total"])
    return sent


def stores(tmp: Path, app: str, processors: int = PARTITIONS) -> dict[str, dict[tuple[str, int], int]]:
    """Every processor's windows, per kind; fails if a window is in two stores."""
    keys = WindowKeySerde(serde_for("str"))
    out: dict[str, dict[tuple[str, int], int]] = {kind: {} for kind in KINDS}
    names = [f"sums_{k}" for k in KINDS]
    for pid in range(processors):
        with RocksDBStore.open(str(tmp / "state" / app / f"processor-{pid}"), names) as store:
            for kind in KINDS:
                for k, v in store.items(f"sums_{kind}"):
                    key = keys.loads(k)
                    assert key not in out[kind], f"{kind}: window {key} is in two stores"
                    out[kind][key] = orjson.loads(v)
    return out


def test_every_kind_of_window_is_exact_through_sigkills_and_each_close_is_sent(broker: str, tmp_path: Path) -> None:
    records = history(2024, n=1200, keys=12)
    topic, app = unique_topic_name("windows"), unique_topic_name("winapp")
    create_topic(broker, topic, partitions=PARTITIONS)
    asyncio.run(produce(broker, topic, records))
    per_part: dict[int, list[tuple[str, int, int]]] = {}
    for r in records:
        per_part.setdefault(partition_for_key(r[0].encode(), PARTITIONS, PARTITIONS), []).append(r)
    want: dict[str, reference.Result] = {kind: reference.Result() for kind in KINDS}
    for part in per_part.values():
        for kind in KINDS:
            one = expected(kind, part)
            want[kind].windows.update(one.stored or one.windows)  # as stored (sliding: per record time)
            want[kind].closes.update(one.closes)

    worker = Worker(broker, tmp_path, app, topic, SK_TEST_DELAY_MS="2", STREAMKIT_MAX_BATCH_RECORDS="50")
    rng = random.Random(5)
    midway = 0
    for _ in range(KILLS):
        worker.start()
        worker.wait_for("hosts processors")
        time.sleep(rng.uniform(0.3, 1.5))
        assert worker.stop(signal.SIGKILL) == -signal.SIGKILL
        midway += 0 < sum(committed(broker, f"streamkit-{app}", topic, PARTITIONS).values()) < len(records)
    assert midway >= min(2, KILLS), "the kills did not come while the worker was working through the records"
    sent_by_killed = len(_read_if_any(broker, f"{app}-closes"))
    worker.start()
    worker.wait_for("hosts processors")  # (a SIGTERM before the worker is up kills it)
    worker.wait_committed(broker, topic, PARTITIONS, len(records))
    assert worker.stop() == 0, worker.log()[-3000:]

    held = stores(tmp_path, app)
    for kind in KINDS:
        assert held[kind] == want[kind].windows, f"{kind}: windows differ from the reference"
    sent = sent_closes(broker, app)
    for kind in KINDS:
        mine = {(k, s): totals for (kd, k, s), totals in sent.items() if kd == kind}
        assert set(mine) == set(want[kind].closes), f"{kind}: closes sent differ from the reference"
        wrong = {w: t for w, t in mine.items() if set(t) != {want[kind].closes[w]}}
        assert not wrong, f"{kind}: closes sent with another value than the final one: {list(wrong.items())[:3]}"
    # a close is sent again only by a life after a kill that came before its checkpoint:
    # at most once per kill, and no more often than the killed lives sent closes at all
    over = {w: t for w, t in sent.items() if len(t) > KILLS + 1}
    assert not over, f"closes sent more often than kills explain: {list(over.items())[:3]}"
    twice = sum(len(t) - 1 for t in sent.values())
    assert twice <= sent_by_killed, f"{twice} closes sent again, more than the killed lives sent ({sent_by_killed})"

    # a lost disk restored from the changelog, then both rebuilt from the input history:
    # the same windows, and no close sent again (the book says which closed)
    closes_sent = len(read_topic(broker, f"{app}-closes"))
    for lost, env in (([0], {}), ([0, 1], {"STREAMKIT_CHANGELOG": "false"})):
        for pid in lost:
            shutil.rmtree(tmp_path / "state" / app / f"processor-{pid}")
        worker.env.update(env)
        worker.start()
        worker.wait_for("hosts processors")  # restored, or rebuilt, before it hosts them
        assert ("restored from the changelog" if not env else "rebuilt from") in worker.log(), worker.log()[-3000:]
        assert worker.stop() == 0, worker.log()[-3000:]
        held = stores(tmp_path, app)
        for kind in KINDS:
            assert held[kind] == want[kind].windows, f"{kind}: windows differ after losing stores {lost}"
        assert len(read_topic(broker, f"{app}-closes")) == closes_sent, f"closes sent again after losing {lost}"


def test_close_on_wall_closes_an_idle_keys_window_without_further_input(broker: str, tmp_path: Path) -> None:
    topic, app = unique_topic_name("wall"), unique_topic_name("wallapp")
    create_topic(broker, topic, partitions=1)
    worker = Worker(broker, tmp_path, app, topic, STREAMKIT_CLOSE_ON="wall", STREAMKIT_CLOSE_ALLOWANCE="0.5")
    worker.env.update(SK_WINDOW="seconds", STREAMKIT_PROCESSORS="1")
    worker.start()
    worker.wait_for("hosts processors")
    now = int(time.time() * 1000)
    asyncio.run(produce(broker, topic, [("idle", now, 3), ("idle", now, 4)]))  # then nothing more
    deadline = time.monotonic() + 30
    while not (closes := _read_if_any(broker, f"{app}-closes")):
        assert time.monotonic() < deadline, f"no close without input: {worker.log()[-3000:]}"
        time.sleep(0.2)
    assert worker.stop() == 0
    [close] = [orjson.loads(r.value) for r in closes]
    assert close["total"] == 7 and close["start"] == now - now % 1000, close
