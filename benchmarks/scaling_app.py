"""The job of `benchmarks.scaling`: a count per key, and one output per input record
carrying the input's send time (so the benchmark can see each key's output stall)."""

from __future__ import annotations

import os
from typing import Any

import streamkit

app = streamkit.App(os.environ.get("SK_BENCH_APP", "scaling-bench"), commit_interval=1.0)
source = app.topic(os.environ.get("SK_BENCH_TOPIC", "scaling-in"))
out = app.topic(os.environ.get("SK_BENCH_OUT", "scaling-out"))
counts = app.table("counts", default=int)


@app.processor(source)
def count(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
    counts[key] += 1
    ctx.send(out, key, {"seq": value["seq"], "sent": value["sent"]})
