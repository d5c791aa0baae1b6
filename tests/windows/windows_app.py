"""A job that sums each key's values per window, for every kind of window, and sends
each window's final value when it closes (to ``closes``) and each late record (to
``late``). ``make_app(kind)`` builds it; as a module run by a worker, the kind comes
from SK_WINDOW (``tumbling``, ``hopping``, ``session``, ``sliding`` or ``count``; ``all``: one table of
each; ``seconds``: tumbling windows of one second)."""

from __future__ import annotations

import os
import time
from typing import Any

import streamkit
from streamkit.windows import Count, Hopping, LateRecordError, Session, Sliding, Tumbling, WindowKind

KINDS: dict[str, WindowKind] = {
    "tumbling": Tumbling(10, grace=4),
    "hopping": Hopping(10, 4, grace=3),
    "session": Session(5, grace=2),
    "sliding": Sliding(6, grace=3),
    "count": Count(4, 3),
}


def make_app(
    kind: str,
    name: str = "windows",
    topic: str = "events",
    *,
    item_syntax: bool = False,
    closes: str = "closes",
    **settings: Any,
) -> streamkit.App:
    """``item_syntax``: ``sums[key] += n`` (tumbling and session windows) instead of ``update``."""
    app = streamkit.App(name, **settings)
    source = app.topic(topic)
    sums = app.table("sums", default=int, window=KINDS.get(kind) or Tumbling(1, grace=0.5))

    @app.processor(source)
    def add(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        if item_syntax:
            sums[key] += value["n"]
        elif isinstance(sums.window, Sliding):
            sums.add(key, value["n"])
        else:
            sums.update(key, lambda total: total + value["n"])

    @app.on_window_close(sums)
    def closed(key: str, window: streamkit.Window, total: int, ctx: streamkit.Context) -> None:
        ctx.send(closes, key, {"start": window.start, "end": window.end, "total": total})

    @app.on_late(sums)
    def late(key: str, value: dict[str, Any], ctx: streamkit.Context, exc: Exception) -> None:
        ctx.send("late", key, {"n": value["n"], "ts": ctx.timestamp})

    return app


def make_all_app(
    name: str, topic: str, delay_ms: float = 0.0, closes: str = "closes", **settings: Any
) -> streamkit.App:
    """One table of each kind (``sums_tumbling``, ...), all summing the same records; every
    close goes to ``closes`` with its table's kind (a late record to ``<closes>-late``).
    ``delay_ms``: per record (a job slow enough to be killed at many points of its input)."""
    app = streamkit.App(name, **settings)
    source = app.topic(topic)
    tables = {kind: app.table(f"sums_{kind}", default=int, window=window) for kind, window in KINDS.items()}

    @app.processor(source)
    def add(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        if delay_ms:
            time.sleep(delay_ms / 1000)
        for table in tables.values():
            try:
                if isinstance(table.window, Sliding):
                    table.add(key, value["n"])
                else:
                    table.update(key, lambda total: total + value["n"])
            except LateRecordError:  # late for one kind, not for the others
                ctx.send(f"{closes}-late", key, {"table": table.name, "ts": ctx.timestamp})

    def closer(kind: str) -> Any:
        def closed(key: str, window: streamkit.Window, total: int, ctx: streamkit.Context) -> None:
            ctx.send(closes, key, {"kind": kind, "start": window.start, "total": total})

        return closed

    for kind, table in tables.items():
        app.on_window_close(table)(closer(kind))
    return app


if os.environ.get("SK_WINDOW") == "all":
    app = make_all_app(
        os.environ.get("SK_TEST_APP", "windows"), os.environ.get("SK_TEST_TOPIC", "events"),
        float(os.environ.get("SK_TEST_DELAY_MS", "0")), os.environ.get("SK_TEST_OUT", "closes"), commit_interval=0.3,
    )  # fmt: skip
elif os.environ.get("SK_WINDOW"):
    app = make_app(
        os.environ["SK_WINDOW"], os.environ.get("SK_TEST_APP", "windows"), os.environ.get("SK_TEST_TOPIC", "events"),
        closes=os.environ.get("SK_TEST_OUT", "closes"), commit_interval=0.3,
    )  # fmt: skip
