"""The job of the processor scaling test: per key, per producer, count and last seq, and
one output record per input record (to the topic named by SK_TEST_OUT)."""

from __future__ import annotations

import os
from typing import Any

import streamkit


def make_app(name: str, topic: str, out: str) -> streamkit.App:
    app = streamkit.App(name, commit_interval=0.3)
    source = app.topic(topic)
    # key -> {producer: [count, last seq, disorder]}
    seen = app.table("seen", default=dict)

    @app.processor(source)
    def track(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        state = seen[key]
        count, last, disorder = state.get(value["p"], (0, -1, 0))
        state[value["p"]] = [count + 1, value["seq"], disorder + (value["seq"] <= last)]
        seen[key] = state
        ctx.send(out, key, {"p": value["p"], "seq": value["seq"], "processor": ctx.processor})

    return app


app = make_app(
    os.environ.get("SK_TEST_APP", "scale"),
    os.environ.get("SK_TEST_TOPIC", "scale-input"),
    os.environ.get("SK_TEST_OUT", "scale-output"),
)
