"""An app for the driver/worker equivalence test with more processors than partitions: a
concurrent async handler (per-key order; IC ranges in its checkpoints), a handler that
fails on some records, output."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import streamkit

app = streamkit.App(os.environ.get("SK_TEST_APP", "driver-shared"), commit_interval=0.3)
events = app.topic(os.environ.get("SK_TEST_TOPIC", "events"))
alerts = app.topic("alerts")
seen = app.table("seen", default=list)  # key -> its records' seqs, in the order applied
sums = app.table("sums", default=int)


@app.processor(events, concurrency=8)
async def on_event(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
    await asyncio.sleep(0)  # other keys' records run meanwhile
    if value.get("bad"):
        raise ValueError(f"bad event {value['seq']}")
    sums[key] += value["n"]
    seen[key] = [*seen[key], value["seq"]]
    if value["n"] >= 90:
        ctx.send(alerts, key, {"seq": value["seq"], "n": value["n"]})
