"""The stateful job of the layout soak test: per key, per producer, count and last seq."""

from __future__ import annotations

import logging
import os
from typing import Any

import streamkit

log = logging.getLogger(__name__)
app = streamkit.App(os.environ.get("SK_TEST_APP", "soak"), commit_interval=0.3)
source = app.topic(os.environ.get("SK_TEST_TOPIC", "soak-input"))
# key -> {producer: [count, last seq, disorder]}
seen = app.table("seen", default=dict)


@app.processor(source)
def track(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
    state = seen[key]
    count, last, disorder = state.get(value["p"], (0, -1, 0))
    if value["seq"] <= last:  # the test fails on this; the log line says where to look
        log.error(
            "out of order: key=%s producer=%s seq=%s after %s at %s[%s]@%s, processor %s",
            key,
            value["p"],
            value["seq"],
            last,
            ctx.topic,
            ctx.partition,
            ctx.offset,
            ctx.processor,
        )
    state[value["p"]] = [count + 1, value["seq"], disorder + (value["seq"] <= last)]
    seen[key] = state
