"""A batch of a handler that blocks (a call to another service, 2 ms per record) lets the
event loop take turns: the group's heartbeats and the job watcher run in the same loop,
and a member that held it for a whole batch (thousands of records in a bootstrap's
rebuild, or a merge releasing them a few at a time) missed its session and was put out
of the group, again and again, while a scale-out waited for it. Real dispatcher, real
RocksDB store, real event loop; the records are applied as a merge hands them over: in
runs of a few records."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson

import streamkit
from streamkit.kafkaio import FetchedRecord
from streamkit.runtime.admission import Admitted
from streamkit.runtime.dispatch import TURN_AFTER
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.routes import Route
from streamkit.testdriver.capture import CaptureProducer
from tests.runtime.test_task_paths import dispatcher_for

BLOCKS = 0.002
RECORDS = 600
"""1.2 s of handlers in all."""


def test_a_blocking_handler_lets_the_loop_take_turns_through_runs_of_a_few_records(tmp_path: Path) -> None:
    app = streamkit.App("loop-turns")
    source = app.topic("loop-turns-in")
    counts = app.table("counts", default=int)
    handled: list[int] = []

    @app.processor(source)
    def count(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        time.sleep(BLOCKS)
        counts[key] += 1
        handled.append(value["i"])

    async def run() -> tuple[list[float], int]:
        dispatcher = dispatcher_for(app, "turns", CaptureProducer())
        proc = await ProcessorState.open(0, tmp_path / "p0", app.tables, 5.0)
        route = Route.build(proc, app.handlers[source.name], (source.name, 0), 0, None)
        ticks: list[float] = []
        done = asyncio.Event()

        async def heartbeat() -> None:  # what the group's heartbeat task needs: its turns
            while not done.is_set():
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        beating = asyncio.create_task(heartbeat())
        await asyncio.sleep(0)
        records = [FetchedRecord(source.name, 0, i, 1_000 + i, f"k{i % 7}".encode(), orjson.dumps({"i": i}), ())
                   for i in range(RECORDS)]  # fmt: skip
        started = time.monotonic()
        for i in range(0, RECORDS, 3):  # runs of three records, as a merge releases them
            run_of = records[i : i + 3]
            await dispatcher.apply(route, Admitted([], run_of, [], [], run_of[-1].offset + 1, len(run_of)))
        ticks.append(started)
        done.set()
        await beating
        proc.close()
        return sorted(t for t in ticks if t >= started), len(handled)

    ticks, applied = asyncio.run(run())
    assert applied == RECORDS and handled == list(range(RECORDS))
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    assert max(gaps) < TURN_AFTER + 0.2, f"the loop waited {max(gaps):.2f} s for a turn ({len(ticks)} turns)"
    assert len(ticks) >= RECORDS * BLOCKS / (TURN_AFTER + 0.2), ticks
