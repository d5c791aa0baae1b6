"""Queries of a job's state by key, from outside: ``GET /tables/{table}/{key}`` (and
``/tables/{table}/{key}/windows``: every window of the key in a windowed table).

Every worker with a ``query_port`` serves them on its own event loop (aiohttp): the one
hosting the key's processor answers from that processor's table (the value as of the
last record it applied, with its input positions); another forwards the request to the
worker whose heartbeat says it hosts the processor. A key whose processor no live worker
hosts right now (a rebalance, a handover) gets 503 with ``Retry-After``. The runtime
decides all of that (``Lookup``); this module only speaks HTTP, and never imports the
runtime (an import contract).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import ClientSession, ClientTimeout, web

__all__ = ["FORWARDED_HEADER", "Answer", "Lookup", "ask", "serve_app", "serve_queries"]

FORWARDED_HEADER = "X-Streamkit-Forwarded"
"""Set on a request one worker forwards to another: that one answers or says 503, never
forwards again."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any] = field(default_factory=dict)
    retry_after: float | None = None
    """Seconds a 503 asks the client to wait before asking again."""


Lookup = Callable[[str, str, bool, bool], Awaitable[Answer]]
"""``lookup(table, key, forwarded, windows)``: the runtime's answer to one query
(``windows``: every window of the key in a windowed table)."""


async def serve_app(app: web.Application, port: int, host: str) -> Callable[[], Awaitable[None]]:
    """Serve ``app`` on ``host:port``; returns what stops it (nothing is left open when
    the port cannot be had)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner.cleanup


def _response(answer: Answer) -> web.Response:
    headers = {"Retry-After": f"{answer.retry_after:g}"} if answer.retry_after is not None else None
    return web.Response(
        status=answer.status, body=orjson.dumps(answer.body), content_type="application/json", headers=headers
    )


async def ask(url: str, timeout: float = 5.0, *, forwarded: bool = False) -> Answer:
    """Ask a worker (``url``: its query URL for the key); ``forwarded``: by another worker
    (it answers or says 503, and does not forward again)."""
    headers = {FORWARDED_HEADER: "1"} if forwarded else {}
    async with ClientSession(timeout=ClientTimeout(total=timeout)) as session:
        async with session.get(url, headers=headers) as reply:
            raw = await reply.read()
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:  # not one of ours (a path the server does not serve)
                body = {"error": raw.decode("utf-8", "replace")[:200]}
            retry = reply.headers.get("Retry-After")
            return Answer(reply.status, body, float(retry) if retry else None)


async def serve_queries(lookup: Lookup, port: int, host: str = "0.0.0.0") -> Callable[[], Awaitable[None]]:
    """Serve ``GET /tables/{table}/{key}`` and ``GET /tables/{table}/{key}/windows`` on
    ``port``; returns what stops the server."""

    async def answer(request: web.Request, windows: bool) -> web.Response:
        forwarded = request.headers.get(FORWARDED_HEADER) == "1"
        return _response(await lookup(request.match_info["table"], request.match_info["key"], forwarded, windows))

    async def value(request: web.Request) -> web.Response:
        return await answer(request, False)

    async def windows(request: web.Request) -> web.Response:
        return await answer(request, True)

    app = web.Application()
    app.router.add_get("/tables/{table}/{key}", value)
    app.router.add_get("/tables/{table}/{key}/windows", windows)
    return await serve_app(app, port, host)
