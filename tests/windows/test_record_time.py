"""A topic's ``timestamp=``: records take their time from their values (field or function;
ms, ISO-8601 or datetime), windows close on that time, a record whose time cannot be read
is a dead letter naming why; and windows have no grace unless given one."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

import streamkit
from streamkit import Tumbling
from streamkit.testing import TestDriver
from streamkit.timestamps import TimestampError, extractor, to_millis

MINUTE = 60_000


def views_app(timestamp: Any) -> streamkit.App:
    app = streamkit.App("views")
    views = app.topic("page-views", timestamp=timestamp)
    per_minute = app.table("per_minute", default=int, window=Tumbling(60))

    @app.processor(views)
    def count(user: str, view: dict[str, Any], ctx: streamkit.Context) -> None:
        per_minute[user] += 1
        ctx.send("seen-at", user, ctx.timestamp)

    @app.on_window_close(per_minute)
    def done(user: str, window: Any, views: int, ctx: streamkit.Context) -> None:
        ctx.send("views-per-minute", user, {"start": window.start, "views": views})

    return app


def test_a_field_gives_each_record_its_time_and_windows_close_on_it_without_grace() -> None:
    # The driver's clock stays at 0: only the values' times move stream time.
    with TestDriver(views_app("ts")) as driver:
        driver.send("page-views", "ann", {"ts": 5 * MINUTE + 1_000})
        driver.send("page-views", "ann", {"ts": "1970-01-01T00:05:30"})  # ISO, naive: UTC
        assert driver.output("views-per-minute") == []
        driver.send("page-views", "ann", {"ts": 6 * MINUTE})  # the next minute starts: minute 5 closes at once
        assert [r.value for r in driver.output("views-per-minute")] == [{"start": 5 * MINUTE, "views": 2}]
        assert [r.value for r in driver.output("seen-at")] == [5 * MINUTE + 1_000, 5 * MINUTE + 30_000, 6 * MINUTE]
        driver.send("page-views", "ann", {"ts": 5 * MINUTE + 59_000})  # minute 5 has closed: late
        assert [d.reason for d in driver.dead_letters()] == ["late"]


def test_a_function_reads_the_time_and_an_unreadable_time_is_a_dead_letter_saying_why() -> None:
    def when(user: str, view: dict[str, Any], kafka_ms: int) -> Any:
        return datetime.fromtimestamp(view["epoch_s"], UTC)

    with TestDriver(views_app(when)) as driver:
        driver.send("page-views", "bob", {"epoch_s": 120})
        driver.send("page-views", "bob", {"other": 1})
        driver.send("page-views", "bob", b"{not json")
        assert [r.value for r in driver.output("seen-at")] == [120_000]
        reasons = [(d.reason, d.error) for d in driver.dead_letters()]
        assert reasons[0][0] == "timestamp" and "when" in reasons[0][1] and "epoch_s" in reasons[0][1], reasons
        assert reasons[1][0] == "value-decode", reasons  # an undecodable value keeps its own dead letter
        assert driver.table("per_minute") == {("bob", 120_000): 1}


def test_field_values_that_are_no_time_are_named() -> None:
    from_field = extractor("page-views", "ts")
    assert from_field("k", {"ts": 1_500.7}, 0) == 1_500
    an_hour_ahead = from_field("k", {"ts": "2026-01-01T00:00:00+01:00"}, 0)
    assert an_hour_ahead == to_millis(datetime(2025, 12, 31, 23, tzinfo=UTC), "")
    for value, says in (({"ts": "soon"}, "neither milliseconds"), ({"ts": True}, "neither milliseconds"),
                        ({"ts": -1}, "must be 0 to"), ({"ts": "1969-12-31T23:00:00"}, "before 1970"),
                        ({}, "no field 'ts'"), ([1], "not an object")):  # fmt: skip
        with pytest.raises(TimestampError, match=says):
            from_field("k", value, 0)
    with pytest.raises(TypeError, match="timestamp must be a field name"):
        streamkit.App("x").topic("t", timestamp=3)  # type: ignore[arg-type]


def test_windows_default_to_no_grace() -> None:
    assert Tumbling(60).grace == 0 and streamkit.Hopping(60, 10).grace == 0 and streamkit.Sliding(60).grace == 0
    assert Tumbling(60).retention == 24 * 3600  # kept a day for reads


def test_an_undecodable_record_moves_no_stream_time_and_a_restart_reads_the_same_times() -> None:
    # The driver's clock (the records' Kafka time) is an hour on: a record whose value does
    # not decode must not carry that time into stream time and close minute 1.
    with TestDriver(views_app("ts"), start_time=3600) as driver:
        driver.send("page-views", "cy", {"ts": MINUTE})
        driver.send("page-views", "cy", b"{not json")
        driver.send("page-views", "cy", {"ts": MINUTE + 1_000})
        assert [d.reason for d in driver.dead_letters()] == ["value-decode"]
        assert driver.table("per_minute") == {("cy", MINUTE): 2}

    def delayed(user: str, view: dict[str, Any], kafka_ms: int) -> int:
        return kafka_ms - view["delay_ms"]  # from the Kafka time: must be the one written, every time

    with TestDriver(views_app(delayed), start_time=100) as driver:
        driver.send("page-views", "dan", {"delay_ms": 1_000})
        driver.restart()  # the record is applied again: with the same time
        assert [r.value for r in driver.output("seen-at")] == [99_000, 99_000]
