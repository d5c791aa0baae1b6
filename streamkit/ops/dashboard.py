"""A live dashboard of a job in the browser: ``GET /`` is the page, ``GET /api/status``
what `streamkit status` shows as JSON (the page polls it every second and keeps the
last minutes for its charts). The page, its script and the chart library (uPlot,
vendored under ``static/``: nothing is fetched from the internet) are served with the
same HTTP stack as the queries.

The caller hands in ``snapshot``: how to look at the cluster. One look runs at a time,
and looks closer together than ``min_interval`` share an answer, so that any number of
open pages cost the cluster one look a second.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from streamkit.ops.queries import refused, serve_app

__all__ = ["STATIC", "Snapshot", "serve_dashboard"]

STATIC = Path(__file__).with_name("static")

Snapshot = Callable[[], Awaitable[dict[str, Any]]]

LOOK_TIMEOUT = 10.0
"""Seconds one look at the cluster may take; then the pages say so, and ask again."""


class _SharedLook:
    """``snapshot``'s answers, one look at a time, reused for ``min_interval`` seconds."""

    def __init__(self, snapshot: Snapshot, min_interval: float) -> None:
        self.snapshot = snapshot
        self.min_interval = min_interval
        self._lock = asyncio.Lock()
        self._answer: tuple[int, bytes] | None = None
        self._at = 0.0

    async def body(self) -> tuple[int, bytes]:
        async with self._lock:
            if self._answer is None or time.monotonic() - self._at >= self.min_interval:
                try:
                    async with asyncio.timeout(LOOK_TIMEOUT):
                        snapshot = await self.snapshot()
                    self._answer = (200, orjson.dumps(snapshot))
                except TimeoutError:
                    error = f"no answer from the cluster within {LOOK_TIMEOUT:g} s"
                    self._answer = (503, orjson.dumps({"error": error}))
                except Exception as exc:  # shown on the page, which keeps polling
                    self._answer = (503, orjson.dumps({"error": f"{type(exc).__name__}: {exc}"}))
                self._at = time.monotonic()
            return self._answer


async def serve_dashboard(
    snapshot: Snapshot,
    port: int,
    host: str = "127.0.0.1",
    *,
    min_interval: float = 0.9,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> Callable[[], Awaitable[None]]:
    """Serve the dashboard on ``port`` (``token``: the status must be asked for with it
    as the bearer token, which the page takes from its address's ``#token=``;
    ``ssl_context``: over HTTPS); returns what stops the server. The page and its script
    hold nothing of the job, and are served to anyone who reaches the port."""
    look = _SharedLook(snapshot, min_interval)

    async def page(_request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "dashboard.html")

    async def status(request: web.Request) -> web.Response:
        if (refusal := refused(request, token)) is not None:
            return refusal
        code, body = await look.body()
        return web.Response(status=code, body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/", page)
    app.router.add_get("/api/status", status)
    app.router.add_static("/static", STATIC)
    return await serve_app(app, port, host, ssl_context)
