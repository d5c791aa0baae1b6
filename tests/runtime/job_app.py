"""The app the runtime tests run in real worker processes (configured by environment)."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import streamkit

FAIL_ALL = os.environ.get("SK_TEST_FAIL_ALL") == "1"
OUT = os.environ.get("SK_TEST_OUT")
# The client's join and sync steps, so that the log of a stuck group shows where its rebalance stopped.
logging.getLogger("aiokafka.consumer.group_coordinator").setLevel(logging.INFO)
# App(...) arguments win over STREAMKIT_* variables: a test that needs another interval says so here
app = streamkit.App(
    os.environ.get("SK_TEST_APP", "runtime-test"),
    commit_interval=float(os.environ.get("SK_TEST_COMMIT_INTERVAL", "0.3")),
)
source = app.topic(
    os.environ.get("SK_TEST_TOPIC", "runtime-test-input"), strays=os.environ.get("SK_TEST_STRAYS", "forward")
)
# key -> {"n": records, "sum": amounts, "last": last seq, "disorder": seqs seen out of order}
stats = app.table("stats", default=lambda: {"n": 0, "sum": 0, "last": -1, "disorder": 0})
# records per key and minute (by the records' timestamps), when asked for
per_minute = (
    app.table("per_minute", default=int, window=streamkit.Tumbling(60)) if os.environ.get("SK_TEST_WINDOWS") else None
)


@app.processor(source)
def count(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
    if value.get("fail") or FAIL_ALL:
        raise ValueError(f"asked to fail at seq {value['seq']}")
    if slow := value.get("slow_ms"):  # a handler that takes its time (a lag that falls slowly)
        time.sleep(slow / 1000)
    s = stats[key]
    stats[key] = {
        "n": s["n"] + 1,
        "sum": s["sum"] + value["amount"],
        "last": value["seq"],
        "disorder": s["disorder"] + (1 if value["seq"] <= s["last"] else 0),
    }
    if per_minute is not None:
        per_minute[key] += 1
    if OUT:  # each record's seq, to check per-key output order
        ctx.send(OUT, key, {"seq": value["seq"]})
