"""The job of tests/joins/test_global_tables.py: orders enriched with their product's price
from a global table of products (a foreign-key join: orders are keyed by order id)."""

from __future__ import annotations

import os
from typing import Any

import streamkit

app = streamkit.App(os.environ.get("SK_TEST_APP", "global-test"), commit_interval=0.3)
orders = app.topic(os.environ.get("SK_TEST_TOPIC", "orders"))
products = app.global_table("products", source=os.environ.get("SK_TEST_PRODUCTS", "products"))
enriched = app.table("enriched")


@app.processor(orders)
def enrich(key: str, order: dict[str, Any], ctx: streamkit.Context) -> None:
    product = products.get(order["product"])
    enriched[key] = {
        "product": order["product"],
        "price": None if product is None else product["price"],
        "known": len(products),  # how many products the worker held when it applied the order
    }
