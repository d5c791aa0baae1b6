"""The two jobs of the exactly-once pipeline test, run as real worker processes (which one
by ``SK_EOS_ROLE``): ``count`` counts the records per key and sends each new count;
``sum`` adds up the counts it receives per key, and writes each new sum to a PostgreSQL
table and a Delta table. Exactly once, the sum of a key with n records is n(n+1)/2; a
count applied twice shows in it."""

from __future__ import annotations

import os
from typing import Any

import streamkit

ROLE = os.environ["SK_EOS_ROLE"]
app = streamkit.App(
    os.environ["SK_TEST_APP"],
    commit_interval=float(os.environ.get("SK_TEST_COMMIT_INTERVAL", "1.0")),
    processing=os.environ.get("SK_EOS_PROCESSING", "exactly_once"),
)
source = app.topic(os.environ["SK_TEST_TOPIC"])
totals = app.table("totals", default=int)

if ROLE == "count":
    counts = app.topic(os.environ["SK_EOS_OUT"])

    @app.processor(source)
    def count(key: str, value: Any, ctx: streamkit.Context) -> None:
        totals[key] += 1
        ctx.send(counts, key, {"n": totals[key]})

else:
    from streamkit.sinks.delta import DeltaSink
    from streamkit.sinks.postgres import PostgresSink

    pg = app.sink("pg", PostgresSink(os.environ["SK_EOS_PG"], os.environ["SK_EOS_PG_TABLE"], key=["key"]))
    delta = app.sink("delta", DeltaSink(os.environ["SK_EOS_DELTA"], key=["key"]))

    @app.processor(source)
    def add(key: str, value: Any, ctx: streamkit.Context) -> None:
        totals[key] += value["n"]
        ctx.write(pg, {"key": key, "total": totals[key]})
        ctx.write(delta, {"key": key, "total": totals[key]})
