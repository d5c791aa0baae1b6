"""The test driver is the worker's code, not a second implementation: the same app and
input through ``TestDriver`` and through real worker processes on an embedded broker give
the same tables, output and dead letters. For ``examples/orders.py`` and for an app with
windows (late records), a concurrent handler, failing records and a timer; with one
partition per processor, several partitions per processor, and more processors than
partitions (shared partitions, each sharer applying its keys, IC ranges from the
concurrent handler)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from streamkit.app import App
from streamkit.broker import EmbeddedBroker
from streamkit.producer import Producer
from streamkit.runtime.processor import ProcessorState
from streamkit.testing import TestDriver, create_topic, read_topic
from tests.runtime.jobs import ROOT

PROCESSORS = 4

Input = list[tuple[str, Any, float]]
"""(key, value, timestamp in seconds); a value of bytes is written as it is."""


def orders_input() -> Input:
    rows: Input = []
    for i in range(600):
        customer = f"c{(i * 37) % 53}"
        amount: Any = (i * 7919) % 100_000
        value: Any = {"amount": amount, "item": f"item-{i % 7}"}
        if i % 97 == 0:
            value = {"amount": "not a number"}  # the handler raises: a dead letter
        if i % 131 == 0:
            value = b"{not json"  # does not decode: a dead letter
        rows.append((customer, value, 1_700_000_000 + i * 0.5))
    return rows


def events_input() -> Input:
    rows: Input = []
    for i in range(500):
        key = f"k{(i * 13) % 29}"
        ts = 1_000 + i * 0.2 - (12 if i % 41 == 0 else 0)  # every 41st is late for its window
        value = {"seq": i, "n": (i * 31) % 100, "bad": i % 53 == 0}
        rows.append((key, value, ts))
    return rows


def through_driver(
    app: App, topic: str, rows: Input, timers: bool, partitions: int = PROCESSORS, processors: int = PROCESSORS
) -> dict[str, Any]:
    with TestDriver(app, processors=processors, partitions=partitions, start_time=rows[-1][2]) as driver:
        for key, value, ts in rows:
            driver.send(topic, key, value, timestamp=ts)
        if timers:
            driver.advance(0.5)  # one firing of every timer, after all the input
        return {
            "tables": {name: driver.table(name) for name in app.tables},
            "placed": {
                pid: sorted(proc.caches["seen"].keys()) for pid, proc in driver._procs.items() if "seen" in app.tables
            },
            "output": {t: Counter(_out(r.key, r.value, r.source) for r in driver.output(t)) for t in _outputs(app)},
            "dead": Counter((d.reason, d.topic, d.partition, d.offset, d.key, d.value) for d in driver.dead_letters()),
        }


def through_worker(
    broker: str, app: App, spec: str, topic: str, rows: Input, state: Path, timers: bool, shape: tuple[int, int]
) -> dict[str, Any]:
    """``shape``: the input topic's partitions and the job's processors."""
    partitions, processors = shape
    create_topic(broker, topic, partitions)

    async def produce() -> None:
        async with Producer(broker, client_id="equivalence") as producer:
            for key, value, ts in rows:
                raw = value if isinstance(value, bytes) else orjson.dumps(value)
                await producer.send(topic, key.encode(), raw, timestamp_ms=int(ts * 1000))

    asyncio.run(produce())
    env = dict(os.environ, STREAMKIT_BROKER=broker, STREAMKIT_STATE_DIR=str(state), PYTHONPATH=str(ROOT),
               STREAMKIT_PROCESSORS=str(processors))  # fmt: skip
    log = state.parent / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen([sys.executable, "-m", "streamkit.cli", "worker", spec], cwd=ROOT, env=env,
                                  stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_caught_up(broker, app, spec, env, worker, log)
        if timers:  # every processor's timer fired after all the input was applied
            wait_for_full_ticks(broker, len(rows), worker, log, processors)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0, log.read_text()[-3000:]
    tables: dict[str, dict[Any, Any]] = {name: {} for name in app.tables}
    placed: dict[int, list[Any]] = {}
    for pid in range(processors):
        proc = asyncio.run(ProcessorState.open(pid, app.store_path(pid, state), app.tables, timeout=5.0))
        try:
            if "seen" in app.tables:  # which processor holds which keys
                placed[pid] = sorted(proc.caches["seen"].keys())
            for name in app.tables:
                tables[name].update(proc.caches[name].items())
        finally:
            proc.close()
    output = {}
    for t in _outputs(app):
        output[t] = Counter(
            _out(app.topics[t].key_serde.loads(r.key), app.topics[t].value_serde.loads(r.value),
                 dict(r.headers).get("streamkit.source", b"").decode() or None)
            for r in read_topic(broker, t)
        )  # fmt: skip
    dead = Counter()
    for r in read_topic(broker, app.dead_letter_topic):
        h = dict(r.headers)
        where = (h["streamkit.source.topic"].decode(), int(h["streamkit.source.partition"]))
        dead[(h["streamkit.error.reason"].decode(), *where, int(h["streamkit.source.offset"]), r.key, r.value)] += 1
    return {"tables": tables, "placed": placed, "output": output, "dead": dead}


def wait_caught_up(broker: str, app: App, spec: str, env: dict[str, str], worker: Any, log: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "streamkit.cli", "status", spec, "--wait-caught-up", "120"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0 and worker.poll() is None, result.stderr + log.read_text()[-3000:]


def wait_for_full_ticks(
    broker: str, records: int, worker: Any, log: Path, processors: int, timeout: float = 60.0
) -> None:
    """Until the timer of every processor has fired with all the input applied: the
    latest ticks of the processors add up to every record that was applied."""
    deadline = time.monotonic() + timeout
    while True:
        latest: dict[str, int] = {}
        for r in read_topic(broker, "ticks"):
            latest[r.key.decode()] = orjson.loads(r.value)["total"]
        dead = len(read_topic(broker, "driver-events-dead-letters"))
        if len(latest) == processors and sum(latest.values()) == records - dead:
            return
        assert worker.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, (latest, records, dead)
        time.sleep(0.2)


def _outputs(app: App) -> list[str]:
    return sorted(t for t in app.topics if t not in app.handlers and t != "ticks")


def _out(key: Any, value: Any, source: str | None) -> tuple[Any, bytes, str | None]:
    return key, orjson.dumps(value, option=orjson.OPT_SORT_KEYS), source


def _same(driver: dict[str, Any], worker: dict[str, Any]) -> None:
    for name, table in driver["tables"].items():
        assert table == worker["tables"][name], f"table {name} differs"
    assert driver["placed"] == worker["placed"], "keys held by other processors"
    assert driver["output"] == worker["output"]
    assert driver["dead"] == worker["dead"]


def test_orders_through_the_driver_and_through_a_worker_agree(tmp_path: Path) -> None:
    from examples.orders import app

    rows = orders_input()
    driven = through_driver(app, "orders", rows, timers=False)
    with EmbeddedBroker() as broker:  # (the apps' topic names are fixed: a broker per test)
        worked = through_worker(
            broker.bootstrap, app, "examples.orders:app", "orders", rows, tmp_path / "state", False, (4, 4)
        )
    assert driven["output"]["big-orders"] and len(driven["dead"]) >= 8  # the input exercises both
    _same(driven, worked)


def test_windows_timers_failures_and_a_concurrent_handler_agree(tmp_path: Path) -> None:
    from tests.testdriver.events_app import app

    rows = events_input()
    driven = through_driver(app, "events", rows, timers=True)
    with EmbeddedBroker() as broker:
        worked = through_worker(
            broker.bootstrap, app, "tests.testdriver.events_app:app", "events", rows, tmp_path / "state", True, (4, 4)
        )
    reasons = Counter(d[0] for d in driven["dead"].elements())
    assert reasons["late"] and reasons["handler"], reasons  # the input exercises both
    assert all(seqs == sorted(seqs) for seqs in driven["tables"]["seen"].values())  # per-key order
    _same(driven, worked)


@pytest.mark.parametrize("shape", [(4, 6), (8, 3)], ids=["4-partitions-6-processors", "8-partitions-3-processors"])
def test_shared_partitions_agree(shape: tuple[int, int], tmp_path: Path) -> None:
    """Partitions and processors in other numbers: each processor reads several partitions,
    whole or shared (each sharer applying its keys only), with IC ranges in its checkpoints
    from the concurrent handler; the driver places them as the worker does."""
    from tests.testdriver.shared_app import app

    rows = events_input()
    driven = through_driver(app, "events", rows, timers=False, partitions=shape[0], processors=shape[1])
    with EmbeddedBroker() as broker:
        worked = through_worker(
            broker.bootstrap, app, "tests.testdriver.shared_app:app", "events", rows, tmp_path / "state", False, shape
        )
    assert all(seqs == sorted(seqs) for seqs in driven["tables"]["seen"].values())  # per-key order
    assert sum(len(s) for s in driven["tables"]["seen"].values()) + len(driven["dead"]) == len(rows)
    _same(driven, worked)
