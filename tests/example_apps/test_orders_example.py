"""The example app's own tests, written as a user writes them: through the test driver,
no broker, milliseconds each (``pytest --durations=0`` shows how many)."""

from __future__ import annotations

from examples.orders import BIG_ORDER_CENTS, app
from streamkit.testing import TestDriver


def test_totals_revenue_per_minute_and_big_orders() -> None:
    with TestDriver(app, processors=4) as driver:
        driver.send("orders", "alice", {"amount": 95_000, "item": "piano"}, timestamp=30)
        driver.send("orders", "alice", {"amount": 500, "item": "book"}, timestamp=90)
        driver.send("orders", "bob", {"amount": 1_000, "item": "lamp"}, timestamp=95)
        assert driver.table("customer_totals") == {
            "alice": {"orders": 2, "amount": 95_500},
            "bob": {"orders": 1, "amount": 1_000},
        }
        assert driver.table("revenue_per_minute") == {
            ("alice", 0): 95_000,
            ("alice", 60_000): 500,
            ("bob", 60_000): 1_000,
        }
        [big] = driver.output("big-orders")
        assert (big.key, big.value) == ("alice", {"amount": 95_000, "item": "piano"})
        assert big.value["amount"] >= BIG_ORDER_CENTS and big.source is not None and big.source.startswith("orders/")


def test_malformed_and_negative_orders_are_dead_letters_and_change_nothing() -> None:
    with TestDriver(app) as driver:
        driver.send("orders", "carol", {"amount": "lots"})
        driver.send("orders", "carol", {"amount": -5})
        driver.send("orders", "carol", b"{not json")
        assert [d.reason for d in driver.dead_letters()] == ["handler", "handler", "value-decode"]
        assert "negative amount -5" in driver.dead_letters()[1].error
        assert driver.table("customer_totals") == {}


def test_a_crash_after_a_checkpoint_applies_nothing_twice() -> None:
    with TestDriver(app) as driver:
        driver.send("orders", "dave", {"amount": 100, "item": "pen"})
        driver.checkpoint()
        driver.send("orders", "dave", {"amount": 95_000, "item": "desk"})
        driver.restart()  # the desk was not checkpointed: applied again, its output sent again
        assert driver.table("customer_totals")["dave"] == {"orders": 2, "amount": 95_100}
        assert [r.value["item"] for r in driver.output("big-orders")] == ["desk", "desk"]
