"""The job of `benchmarks.sharing`: a count and a sum per key, with a handler that burns
``SK_BENCH_BURN_US`` microseconds of CPU per record (0: as cheap as it gets), or an
async one that awaits ``SK_BENCH_SLEEP_MS`` per record with ``SK_BENCH_CONCURRENCY``
records of different keys at once. Each worker notes when it applied its first and last
record."""

from __future__ import annotations

import asyncio
import atexit
import os
import time
from pathlib import Path
from typing import Any

import orjson

import streamkit

BURN = int(os.environ.get("SK_BENCH_BURN_US", "0")) / 1e6
SLEEP = float(os.environ.get("SK_BENCH_SLEEP_MS", "0")) / 1e3
CONCURRENCY = int(os.environ.get("SK_BENCH_CONCURRENCY", "1"))

app = streamkit.App(os.environ.get("SK_BENCH_APP", "sharing-bench"), commit_interval=1.0)
source = app.topic(os.environ.get("SK_BENCH_TOPIC", "sharing-in"))
totals = app.table("totals", default=lambda: [0, 0])
seen = {"first": 0.0, "last": 0.0, "records": 0}
"""When this worker applied its first and last record (written to SK_BENCH_TIMES at exit)."""


@atexit.register
def _write_times() -> None:
    if out := os.environ.get("SK_BENCH_TIMES"):
        (Path(out) / f"{os.getpid()}.json").write_bytes(orjson.dumps(seen))


def count(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
    if BURN:
        until = time.perf_counter() + BURN
        while time.perf_counter() < until:
            pass
    now = time.time()
    if not seen["first"]:
        seen["first"] = now
    seen["last"] = now
    seen["records"] += 1
    count_sum = totals[key]
    totals[key] = [count_sum[0] + 1, count_sum[1] + value["amount"]]


if SLEEP:  # I/O-bound: the handler awaits SLEEP seconds per record, up to CONCURRENCY at once

    @app.processor(source, concurrency=CONCURRENCY)
    async def count_slowly(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        await asyncio.sleep(SLEEP)
        count(key, value, ctx)

else:
    app.processor(source)(count)
