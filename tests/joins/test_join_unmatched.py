"""A left or outer join's calls for the records that met nobody stand alone: one that
raises is said on its own (key, side, time) and counted, and the bucket's other records
are still called (the test driver: no broker)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import streamkit
from streamkit.testing import TestDriver


def test_a_failing_call_for_one_unmatched_record_does_not_drop_the_rest_of_its_bucket(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("streamkit.joins.stream_join.SAY_EVERY", 0.0)  # every failure said (limit: below)
    app = streamkit.App("unmatched")
    views, clicks = app.topic("views"), app.topic("clicks")

    @app.join(views, clicks, within=5, how="outer")
    def seen(user: str, view: Any, click: Any, ctx: streamkit.Context) -> None:
        if (view or click)["id"] in ("v1", "c1"):
            raise ValueError("cannot emit this one")
        ctx.send("joined", user, {"view": view and view["id"], "click": click and click["id"]})

    with TestDriver(app) as driver, caplog.at_level(logging.ERROR, logger="streamkit.joins.stream_join"):
        # bucket [0, 5 s) of user u: two views, of user w: two clicks; none meets a partner
        driver.send("views", "u", {"id": "v1"}, timestamp=0.5)
        driver.send("views", "u", {"id": "v2"}, timestamp=1.0)
        driver.send("clicks", "w", {"id": "c1"}, timestamp=4.0)
        driver.send("clicks", "w", {"id": "c2"}, timestamp=4.5)
        assert driver.output("joined") == []
        driver.send("views", "x", {"id": "v9"}, timestamp=30)  # stream time 30 s: the buckets close
        assert {r.key: r.value for r in driver.output("joined")} == {
            "u": {"view": "v2", "click": None},
            "w": {"view": None, "click": "c2"},
        }
        assert len(driver.output("joined")) == 2
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 2
        assert all("join 'seen'" in line for line in said)
        assert any("the left record of views with key 'u' at 500 ms" in line for line in said)
        assert any("the right record of clicks with key 'w' at 4000 ms" in line for line in said)
        assert "2 such call(s) failed so far" in said[1]
        assert all(r.exc_info is not None and "cannot emit this one" in str(r.exc_info[1]) for r in caplog.records)
        assert app.joins["seen"].failed_unmatched == 2
        assert driver.dead_letters() == []


def test_a_join_failing_on_every_unmatched_record_says_so_once_in_a_while(caplog: pytest.LogCaptureFixture) -> None:
    app = streamkit.App("unmatched-flood")
    views, clicks = app.topic("views"), app.topic("clicks")

    @app.join(views, clicks, within=5, how="left")
    def seen(user: str, view: Any, click: Any, ctx: streamkit.Context) -> None:
        raise ValueError(f"cannot emit {view['id']}")

    with TestDriver(app) as driver, caplog.at_level(logging.ERROR, logger="streamkit.joins.stream_join"):
        for i in range(20):
            driver.send("views", f"u{i}", {"id": f"v{i}"}, timestamp=1 + i / 10)
        driver.send("views", "x", {"id": "late-closer"}, timestamp=60)
    assert app.joins["seen"].failed_unmatched == 20
    assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]
