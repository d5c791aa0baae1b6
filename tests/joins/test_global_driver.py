"""Global tables through the test driver: a foreign-key join by lookup, updates and
tombstones of the table's topic, and what a global table refuses."""

from __future__ import annotations

from typing import Any

import pytest

import streamkit
from streamkit.testdriver import TestDriver


def _app() -> tuple[streamkit.App, Any]:
    app = streamkit.App("fk-join")
    orders = app.topic("orders")
    products = app.global_table("products", source="products")
    enriched = app.table("enriched")

    @app.processor(orders)
    def enrich(key: str, order: dict[str, Any], ctx: streamkit.Context) -> None:
        product = products.get(order["product"])
        enriched[key] = None if product is None else product["price"] * order["qty"]
        ctx.send("priced", key, {"total": enriched[key], "known": len(products)})

    return app, products


def test_orders_see_the_products_as_their_topic_last_said() -> None:
    app, _ = _app()
    with TestDriver(app, processors=2) as driver:
        for i in range(5):
            driver.send("products", f"p{i}", {"price": 10 * i})
        driver.send("orders", "o1", {"product": "p3", "qty": 2})
        driver.send("products", "p3", {"price": 7})  # a new price
        driver.send("products", "p4", None)  # a tombstone
        driver.send("orders", "o2", {"product": "p3", "qty": 2})
        driver.send("orders", "o3", {"product": "p4", "qty": 1})
        driver.send("orders", "o4", {"product": "p9", "qty": 1})  # never a product
        driver.send("products", "p2", b"{not json")  # undecodable: p2's old price must not be served
        driver.send("orders", "o5", {"product": "p2", "qty": 1})
        assert driver.table("enriched") == {"o1": 60, "o2": 14, "o3": None, "o4": None, "o5": None}
        assert [r.value for r in driver.output("priced")] == [
            {"total": 60, "known": 5},
            {"total": 14, "known": 4},
            {"total": None, "known": 4},
            {"total": None, "known": 4},
            {"total": None, "known": 3},
        ]


def test_a_global_table_is_read_only_and_held_only_where_the_app_runs() -> None:
    app, products = _app()
    with pytest.raises(RuntimeError, match="global table 'products' is read only inside a running worker"):
        products.get("p1")
    with pytest.raises(TypeError, match="for lookups by key"):
        iter(products)
    assert not hasattr(products, "__setitem__")
    with pytest.raises(ValueError, match="declared twice"):
        app.global_table("products", source="other")
    with pytest.raises(ValueError, match="declared twice"):
        app.table("products")
