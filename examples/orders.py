"""Per-customer order totals and per-minute revenue: the example app.

Run it (against a broker, e.g. `streamkit broker` in another terminal):

    STREAMKIT_BROKER=127.0.0.1:9092 streamkit worker examples.orders:app --members 2
    STREAMKIT_BROKER=127.0.0.1:9092 python -m examples.order_producer --orders 10000

`python -m examples.demo` does all of it on the embedded broker and checks the result.
"""

from __future__ import annotations

from typing import Any

import streamkit
from streamkit import Context, Tumbling

app = streamkit.App("orders-demo", commit_interval=0.5)

orders = app.topic("orders")  # key: customer id (str), value: {"amount": cents, "item": str}
big_orders = app.topic("big-orders")

# customer -> {"orders": n, "amount": cents}
customer_totals = app.table("customer_totals", default=dict)
# (customer, minute) -> cents; a minute accepts orders up to a minute after its end (a processor
# reading several partitions of a grown topic sees their records interleaved, not in time order)
revenue_per_minute = app.table("revenue_per_minute", default=int, window=Tumbling(60, grace=60))

BIG_ORDER_CENTS = 90_000


@app.processor(orders)
def on_order(customer: str, order: dict[str, Any], ctx: Context) -> None:
    amount = int(order["amount"])  # a malformed order raises here and goes to the dead letters
    if amount < 0:
        raise ValueError(f"negative amount {amount} for customer {customer}")
    total = customer_totals[customer]
    customer_totals[customer] = {
        "orders": total.get("orders", 0) + 1,
        "amount": total.get("amount", 0) + amount,
    }
    revenue_per_minute[customer] += amount
    if amount >= BIG_ORDER_CENTS:
        ctx.send(big_orders, customer, {"amount": amount, "item": order.get("item")})
