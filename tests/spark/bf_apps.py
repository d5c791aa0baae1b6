"""Apps the Spark bridge tests backfill (imported by Spark workers too)."""

from __future__ import annotations

from typing import Any

import streamkit
from streamkit import Tumbling

# count + sum per key: the shape of the acceptance test and the benchmark
counts = streamkit.App("bf-counts", processors=3)
events = counts.topic("events")
totals = counts.table("totals")


@counts.processor(events)
def count(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
    row = totals.get(key) or {"count": 0, "sum": 0}
    totals[key] = {"count": row["count"] + 1, "sum": row["sum"] + value["amount"]}


# two tables written by one handler, an int-keyed topic, a raw-valued table
multi = streamkit.App("bf-multi", processors=2)
m_events = multi.topic("m-events", key_serde="int")
m_sums = multi.table("sums", key_serde="int", value_serde="json")
m_last = multi.table("last", key_serde="int", value_serde="str")


@multi.processor(m_events)
def m_handle(key: int, value: dict[str, Any], ctx: streamkit.Context) -> None:
    m_sums[key] = (m_sums.get(key) or 0) + value["amount"]
    if value.get("tag") is not None:
        m_last[key] = value["tag"]
    elif key in m_last and value["amount"] == 0:
        del m_last[key]


# windowed: supported by the replay, refused from final state
windowed = streamkit.App("bf-windowed", processors=2)
w_events = windowed.topic("w-events")
per_minute = windowed.table("per_minute", window=Tumbling(60), default=int)


@windowed.processor(w_events)
def w_handle(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
    per_minute[key] += value["amount"]


# a handler the per-key replay cannot reproduce: it touches another key's state
bad = streamkit.App("bf-bad", processors=2)
b_events = bad.topic("b-events")
b_totals = bad.table("totals", default=int)


@bad.processor(b_events)
def b_handle(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
    b_totals[key] += 1
    b_totals["grand-total"] += 1


# a per-processor timer changes state: the replay cannot reproduce it
timed = streamkit.App("bf-timed", processors=2)
t_events = timed.topic("t-events")
t_totals = timed.table("totals", default=int)


@timed.processor(t_events)
def t_handle(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
    t_totals[key] += 1


@timed.every(60)
def t_decay(ctx: streamkit.Context) -> None:
    for key, n in list(t_totals.items()):
        t_totals[key] = n // 2
