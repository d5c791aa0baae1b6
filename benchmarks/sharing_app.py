"""The job of `benchmarks.sharing`: a count and a sum per key, with a handler that burns
``SK_BENCH_BURN_US`` microseconds of CPU per record (0: as cheap as it gets)."""

from __future__ import annotations

import os
import time
from typing import Any

import streamkit

BURN = int(os.environ.get("SK_BENCH_BURN_US", "0")) / 1e6

app = streamkit.App(os.environ.get("SK_BENCH_APP", "sharing-bench"), commit_interval=1.0)
source = app.topic(os.environ.get("SK_BENCH_TOPIC", "sharing-in"))
totals = app.table("totals", default=lambda: [0, 0])


@app.processor(source)
def count(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
    if BURN:
        until = time.perf_counter() + BURN
        while time.perf_counter() < until:
            pass
    count_sum = totals[key]
    totals[key] = [count_sum[0] + 1, count_sum[1] + value["amount"]]
