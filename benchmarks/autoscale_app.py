"""The job of `benchmarks.autoscale`: a count per key whose handler waits about 1 ms per
record (an I/O-bound job: a worker process applies under 1,000 records/s, so capacity
grows with processes even on two cores), one output per input record."""

from __future__ import annotations

import os
import time
from typing import Any

import streamkit

app = streamkit.App(os.environ.get("SK_BENCH_APP", "autoscale-bench"), commit_interval=1.0)
source = app.topic(os.environ.get("SK_BENCH_TOPIC", "autoscale-in"))
out = app.topic(os.environ.get("SK_BENCH_OUT", "autoscale-out"))
counts = app.table("counts", default=int)
WAIT = float(os.environ.get("SK_BENCH_WAIT_MS", "1")) / 1000


@app.processor(source)
def count(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
    time.sleep(WAIT)  # a call to another service
    counts[key] += 1
    ctx.send(out, key, {"seq": value["seq"], "n": counts[key]})
