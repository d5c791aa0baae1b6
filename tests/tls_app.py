"""A small job for the TLS test: counts records per key of the topic named by SK_TEST_TOPIC;
the connection comes from the STREAMKIT_* variables."""

from __future__ import annotations

import os
from typing import Any

import streamkit

app = streamkit.App("tls-test-app", commit_interval=0.5, session_timeout_ms=6000)
counts = app.table("counts", default=int)


@app.processor(app.topic(os.environ.get("SK_TEST_TOPIC", "tls-input")))
def count(key: str, value: Any, ctx: streamkit.Context) -> None:
    counts[key] += 1
