"""An app for the driver/worker equivalence test: a windowed table with grace (late
records are dead letters), a concurrent async handler (per-key order), a handler that
fails on some records, output, and a per-processor timer that writes a table and sends."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import streamkit
from streamkit import Tumbling

app = streamkit.App(os.environ.get("SK_TEST_APP", "driver-events"), commit_interval=0.3)
events = app.topic(os.environ.get("SK_TEST_TOPIC", "events"))
alerts = app.topic("alerts")
ticks = app.topic("ticks")
per_window = app.table("per_window", default=int, window=Tumbling(10, grace=5, retention=3600))
seen = app.table("seen", default=list)  # key -> its records' seqs, in the order applied
counted = app.table("counted", default=int)  # key -> records seen when the timer last fired


@app.processor(events, concurrency=8)
async def on_event(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
    await asyncio.sleep(0)  # other keys' records run meanwhile
    if value.get("bad"):
        raise ValueError(f"bad event {value['seq']}")
    per_window[key] += value["n"]
    seen[key] = [*seen[key], value["seq"]]
    if value["n"] >= 90:
        ctx.send(alerts, key, {"seq": value["seq"], "n": value["n"]})


@app.every(0.5)
def tally(ctx: streamkit.Context) -> None:
    total = 0
    for key, seqs in seen.items():
        counted[key] = len(seqs)
        total += len(seqs)
    ctx.send(ticks, f"processor-{ctx.processor}", {"total": total})
