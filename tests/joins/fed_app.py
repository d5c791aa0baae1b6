"""The job of tests/joins/test_fed_tables.py: orders (keyed by customer) joined with the
customer as of the order's time, from a table fed by the customers topic."""

from __future__ import annotations

import os
from typing import Any

import streamkit

app = streamkit.App(os.environ.get("SK_TEST_APP", "fed-test"), commit_interval=0.3)
orders = app.topic(os.environ.get("SK_TEST_TOPIC", "orders"))
customers = app.table("customers", source=os.environ.get("SK_TEST_CUSTOMERS", "customers"))
out = app.topic(os.environ.get("SK_TEST_OUT", "joined"))
totals = app.table("totals", default=lambda: [0, 0])


@app.processor(orders)
def join(key: str, order: dict[str, Any], ctx: streamkit.Context) -> None:
    customer = customers.get(key)  # as of the order's timestamp
    level = None if customer is None else customer["level"]
    n, total = totals[key]
    totals[key] = [n + 1, total + (level or 0)]
    ctx.send(out, order["id"], {"customer": key, "level": level})
