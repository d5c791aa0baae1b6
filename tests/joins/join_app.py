"""The job of tests/joins/test_stream_joins.py: views and clicks (keyed by user) joined
within 5 s, inner, left and outer, each join's calls sent to a topic of its own."""

from __future__ import annotations

import os
from typing import Any

import streamkit

app = streamkit.App(os.environ.get("SK_TEST_APP", "join-test"), commit_interval=0.3)
views = app.topic(os.environ.get("SK_TEST_TOPIC", "views"))
clicks = app.topic(os.environ.get("SK_TEST_CLICKS", "clicks"))
OUT = os.environ.get("SK_TEST_OUT", "joined")
WITHIN, GRACE = 5.0, 3.0


def _pair(view: Any, click: Any) -> dict[str, Any]:
    return {"view": None if view is None else view["id"], "click": None if click is None else click["id"]}


@app.join(views, clicks, within=WITHIN, grace=GRACE)
def inner(user: str, view: Any, click: Any, ctx: streamkit.Context) -> None:
    ctx.send(f"{OUT}-inner", user, _pair(view, click))


@app.join(views, clicks, within=WITHIN, grace=GRACE, how="left")
def left(user: str, view: Any, click: Any, ctx: streamkit.Context) -> None:
    ctx.send(f"{OUT}-left", user, _pair(view, click))


@app.join(views, clicks, within=WITHIN, grace=GRACE, how="outer")
def outer(user: str, view: Any, click: Any, ctx: streamkit.Context) -> None:
    ctx.send(f"{OUT}-outer", user, _pair(view, click))
