"""The app of the end-to-end backfill test (worker processes load ``app``, configured by
environment; the test builds its own instances with :func:`make_app`)."""

from __future__ import annotations

import os
from typing import Any

import streamkit


def make_app(name: str, topic: str) -> streamkit.App:
    """count / sum / last seq / disorder per key: exact state is easy to check."""
    app = streamkit.App(name, processors=3, commit_interval=0.3)
    source = app.topic(topic)
    stats = app.table("stats", default=lambda: {"n": 0, "sum": 0, "last": -1, "disorder": 0})

    @app.processor(source)
    def count(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        s = stats[key]
        stats[key] = {
            "n": s["n"] + 1,
            "sum": s["sum"] + value["amount"],
            "last": value["seq"],
            "disorder": s["disorder"] + (1 if value["seq"] <= s["last"] else 0),
        }

    return app


app = make_app(os.environ.get("SK_BF_APP", "bf-e2e"), os.environ.get("SK_BF_TOPIC", "bf-e2e-input"))
