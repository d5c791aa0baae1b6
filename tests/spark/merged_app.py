"""An app of tests/spark/test_spark_merged_replay.py that reads three topics: orders
joined with their customer as of the order's time (a table fed by the customers topic),
with their product (a global table: a foreign-key join) and with clicks within 5 s (a
left stream-stream join), all writing state."""

from __future__ import annotations

import os
from typing import Any

import streamkit


def make_app(
    name: str, orders_topic: str, clicks_topic: str, customers_topic: str, products_topic: str
) -> streamkit.App:
    app = streamkit.App(name, commit_interval=0.3)
    orders = app.topic(orders_topic)
    clicks = app.topic(clicks_topic)
    customers = app.table("customers", source=customers_topic)
    products = app.global_table("products", source=products_topic)
    totals = app.table("totals", default=lambda: [0, 0, 0])
    pairs = app.table("pairs", default=lambda: [])

    @app.processor(orders)
    def order(key: str, order: dict[str, Any], ctx: streamkit.Context) -> None:
        customer = customers.get(key)  # as of the order's timestamp
        product = products.get(order["product"])  # by a key other than the record's
        n, levels, prices = totals[key]
        level = 0 if customer is None else customer["level"]
        totals[key] = [n + 1, levels + level, prices + (0 if product is None else product["price"])]

    @app.join(orders, clicks, within=5.0, grace=1.0, how="left")
    def paired(key: str, order: Any, click: Any, ctx: streamkit.Context) -> None:
        if order is not None and click is not None:  # a lone order's call (at a close) writes nothing
            pairs[key] = [*pairs[key], [order["id"], click["id"]]]

    return app


app = make_app(
    os.environ.get("SK_TEST_APP", "bf-merged"),
    os.environ.get("SK_TEST_TOPIC", "orders"),
    os.environ.get("SK_TEST_CLICKS", "clicks"),
    os.environ.get("SK_TEST_CUSTOMERS", "customers"),
    os.environ.get("SK_TEST_PRODUCTS", "products"),
)
