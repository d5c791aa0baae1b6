"""The test driver's own promises: time moves only when told (timers fire in order, at
the driver's clock), windows close and expire on stream time, a restart drops what was
not checkpointed and applies it again (exact state, at-least-once output), and the same
calls give the same result on every run."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import pytest

import streamkit
from streamkit import Tumbling
from streamkit.testing import TestDriver


def orders_app() -> streamkit.App:
    from examples.orders import app

    return app


def feed(driver: TestDriver, n: int, start: int = 0) -> None:
    """``n`` orders of 5 customers, about one in five of them big (an output record)."""
    for i in range(start, start + n):
        driver.send("orders", f"c{i % 5}", {"amount": 50_000 + (i * 7919) % 50_000, "item": "x"}, timestamp=60.0 * i)


def sent(driver: TestDriver) -> list[tuple[str, bytes, str | None]]:
    return [(r.key, orjson.dumps(r.value), r.source) for r in driver.output("big-orders")]


def test_a_restart_drops_what_was_not_checkpointed_and_applies_it_again() -> None:
    """State after the restart is every record applied once; output sent after the
    checkpoint is sent again (at least once), what was sent before it is not."""
    app = orders_app()
    with TestDriver(app, processors=2) as straight:
        feed(straight, 30)
        want_tables = {name: straight.table(name) for name in app.tables}
        want_output = sent(straight)
    with TestDriver(app, processors=2) as driver:
        feed(driver, 20)
        driver.checkpoint()
        before = len(driver.output("big-orders"))
        feed(driver, 10, start=20)
        after = sent(driver)[before:]
        driver.restart()
        assert {name: driver.table(name) for name in app.tables} == want_tables
        got = sent(driver)
    assert after, "records after the checkpoint sent output"
    assert Counter(got) == Counter(want_output) + Counter(after)  # those, twice; the rest once


def test_a_restart_without_a_checkpoint_starts_from_nothing_and_replays_everything() -> None:
    app = orders_app()
    with TestDriver(app) as driver:
        for i in range(5):
            driver.send("orders", f"c{i % 2}", {"amount": 90_000 + i, "item": "x"})
        totals = driver.table("customer_totals")
        driver.restart()
        assert driver.table("customer_totals") == totals
        assert Counter(r.value["amount"] for r in driver.output("big-orders")) == {90_000 + i: 2 for i in range(5)}


ticker = streamkit.App("driver-ticker")
ticks_in = ticker.topic("ticks-in")
counts = ticker.table("counts", default=int)
per_second = ticker.table("per_second", default=int, window=Tumbling(1, grace=0.5, retention=5))
fired: list[tuple[float, int]] = []


@ticker.processor(ticks_in)
def count(key: str, value: Any, ctx: streamkit.Context) -> None:
    per_second[key] += 1  # a late record raises here, before anything is written
    counts[key] += 1


@ticker.every(0.5)
def report(ctx: streamkit.Context) -> None:
    per_second["timer"] += 1  # the window of the driver's clock
    ctx.send("reports", f"p{ctx.processor}", {"at": ctx.timestamp, "total": sum(v for _, v in counts.items())})


@ticker.every(2.0)
def once_per_worker() -> None:
    fired.append((0.0, len(fired)))


def test_timers_fire_when_the_clock_is_advanced_in_order_at_the_drivers_time() -> None:
    fired.clear()
    with TestDriver(ticker, start_time=100.0) as driver:
        driver.send("ticks-in", "a", 1)
        assert driver.output("reports") == [] and not fired  # nothing runs by itself
        driver.advance(2.2)
        reports = [r.value for r in driver.output("reports")]
        assert [r["at"] for r in reports] == [100_500, 101_000, 101_500, 102_000]
        assert all(r["total"] == 1 for r in reports) and len(fired) == 1
        windows = {k: v for k, v in driver.table("per_second").items() if k[0] == "timer"}
        assert windows == {("timer", 100_000): 1, ("timer", 101_000): 2, ("timer", 102_000): 1}
        with pytest.raises(ValueError, match="forward only"):
            driver.advance(-1)


def test_late_records_are_dead_letters_and_old_windows_expire_at_a_checkpoint() -> None:
    with TestDriver(ticker) as driver:
        driver.send("ticks-in", "a", 1, timestamp=10.2)
        driver.send("ticks-in", "a", 1, timestamp=12.0)
        driver.send("ticks-in", "a", 1, timestamp=10.9)  # window 10 closed at 11.5
        assert [d.reason for d in driver.dead_letters()] == ["late"]
        assert driver.table("per_second") == {("a", 10_000): 1, ("a", 12_000): 1}
        driver.send("ticks-in", "a", 1, timestamp=20.0)
        driver.checkpoint()  # window 10 ended 10 s ago, retention 5 s: deleted
        assert driver.table("per_second") == {("a", 20_000): 1}
        assert driver.table("counts") == {"a": 3}


def test_the_same_calls_give_the_same_result_on_every_run() -> None:
    from tests.testdriver.events_app import app
    from tests.testdriver.test_equivalence import events_input

    def run() -> tuple[Any, ...]:
        with TestDriver(app, processors=3, start_time=0.0) as driver:
            for key, value, ts in events_input():
                driver.send("events", key, value, timestamp=ts)
            driver.advance(1.0)
            return (
                {name: driver.table(name) for name in app.tables},
                [(r.key, r.value, r.headers) for t in ("alerts", "ticks") for r in driver.output(t)],
                driver.dead_letters(),
            )

    assert run() == run()


def test_a_topic_or_table_the_app_does_not_have_is_named() -> None:
    with TestDriver(orders_app()) as driver:
        with pytest.raises(KeyError, match="no handler for topic 'order'"):
            driver.send("order", "c", {})
        with pytest.raises(KeyError, match="no table 'totals'"):
            driver.table("totals")
