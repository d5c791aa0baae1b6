"""Queries of a job's state by key, from outside: ``GET /tables/{table}/{key}`` (and
``/tables/{table}/{key}/windows``: every window of the key in a windowed table).

Every worker with a ``query_port`` serves them on its own event loop (aiohttp): the one
hosting the key's processor answers from that processor's table (the value as of the
last record it applied, with its input positions); another forwards the request to the
worker whose heartbeat says it hosts the processor. A key whose processor no live worker
hosts right now (a rebalance, a handover) gets 503 with ``Retry-After``. The runtime
decides all of that (``Lookup``); this module only speaks HTTP, and never imports the
runtime (an import contract).

Served at ``127.0.0.1`` unless told otherwise (``query_bind``). With a token, every
request (forwarded ones included) must carry ``Authorization: Bearer TOKEN`` (else 401,
compared in constant time); with a certificate and key, over HTTPS.

aiohttp is imported by the functions that speak HTTP, when they are called: a worker
without a query port, which neither serves queries nor forwards them, never loads it
(9 MB of its memory).
"""

from __future__ import annotations

import hmac
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from streamkit.errors import ConfigError

if TYPE_CHECKING:
    from aiohttp import web

__all__ = [
    "FORWARDED_HEADER",
    "Answer",
    "Lookup",
    "advertised_url",
    "ask",
    "client_tls",
    "refused",
    "serve_app",
    "serve_queries",
    "server_tls",
]

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


async def serve_app(
    app: web.Application, port: int, host: str, ssl_context: ssl.SSLContext | None = None
) -> Callable[[], Awaitable[None]]:
    """Serve ``app`` on ``host:port`` (over HTTPS with ``ssl_context``); returns what stops
    it (nothing is left open when the port cannot be had)."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner.cleanup


def refused(request: web.Request, token: str | None) -> web.Response | None:
    """The 401 answer to a request that does not carry ``token`` as its bearer token
    (compared in constant time); None when it does, or when there is no token."""
    from aiohttp import web

    if token is None:
        return None
    given = request.headers.get("Authorization", "").encode("utf-8", "replace")
    if hmac.compare_digest(given, f"Bearer {token}".encode()):
        return None
    why = "a wrong query token" if given else "no query token (Authorization: Bearer TOKEN)"
    return web.Response(
        status=401,
        body=orjson.dumps({"error": f"unauthorized: the request carries {why}"}),
        content_type="application/json",
        headers={"WWW-Authenticate": "Bearer"},
    )


def _response(answer: Answer) -> web.Response:
    from aiohttp import web

    headers = {"Retry-After": f"{answer.retry_after:g}"} if answer.retry_after is not None else None
    return web.Response(
        status=answer.status, body=orjson.dumps(answer.body), content_type="application/json", headers=headers
    )


def server_tls(certfile: str, keyfile: str) -> ssl.SSLContext:
    """The context queries are served over HTTPS with; a certificate and key that do not
    load are one line (``ConfigError``)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        why = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(
            f"query_tls_certfile {certfile} with query_tls_keyfile {keyfile} does not load: {why}"
        ) from None
    return ctx


def client_tls(cafile: str | None) -> ssl.SSLContext:
    """The context a worker's HTTPS query certificate is checked with: against ``cafile``
    (PEM), else the system's trusted CAs."""
    try:
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        why = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"CA bundle {cafile} does not load: {why}") from None


def advertised_url(port: int, bind: str, host: str | None, hostname: str, tls: bool) -> str:
    """The query URL a worker tells the others (heartbeats) and clients: at ``host`` if
    given, else at the bound address when it is one address, else at ``hostname`` (the
    machine's name); ``https`` with TLS."""
    if host is None:
        host = hostname if bind in ("", "0.0.0.0", "::") else bind
    if ":" in host and not host.startswith("["):  # an IPv6 address
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}"


def _may_carry_token(url: str) -> bool:
    """A token goes over HTTPS, or over plain HTTP to this machine only: a query URL comes
    from the workers' heartbeats, which anyone who can write to the cluster could forge to
    name a host of theirs (which then gets no token, and the query fails with 401)."""
    import ipaddress
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme == "https":
        return True
    host = parts.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def ask(
    url: str,
    timeout: float = 5.0,
    *,
    forwarded: bool = False,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> Answer:
    """Ask a worker (``url``: its query URL for the key); ``forwarded``: by another worker
    (it answers or says 503, and does not forward again); ``token``: sent as the bearer
    token (over HTTPS, or plain HTTP to this machine only: ``_may_carry_token``);
    ``ssl_context``: what an https URL's certificate is checked with (None: the system's
    trusted CAs)."""
    from aiohttp import ClientSession, ClientTimeout

    headers = {FORWARDED_HEADER: "1"} if forwarded else {}
    if token is not None and _may_carry_token(url):
        headers["Authorization"] = f"Bearer {token}"
    async with ClientSession(timeout=ClientTimeout(total=timeout)) as session:
        async with session.get(url, headers=headers, ssl=ssl_context if ssl_context is not None else True) as reply:
            raw = await reply.read()
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:  # not one of ours (a path the server does not serve)
                body = {"error": raw.decode("utf-8", "replace")[:200]}
            retry = reply.headers.get("Retry-After")
            return Answer(reply.status, body, float(retry) if retry else None)


async def serve_queries(
    lookup: Lookup,
    port: int,
    host: str = "127.0.0.1",
    *,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> Callable[[], Awaitable[None]]:
    """Serve ``GET /tables/{table}/{key}`` and ``GET /tables/{table}/{key}/windows`` on
    ``host:port`` (``token``: every request must carry it as its bearer token;
    ``ssl_context``: over HTTPS); returns what stops the server."""
    from aiohttp import web

    @web.middleware
    async def authorized(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if (
            refusal := refused(request, token)
        ) is not None:  # (a response with no headers is falsy before aiohttp 3.12)
            return refusal
        return await handler(request)

    async def answer(request: web.Request, windows: bool) -> web.Response:
        forwarded = request.headers.get(FORWARDED_HEADER) == "1"
        return _response(await lookup(request.match_info["table"], request.match_info["key"], forwarded, windows))

    async def value(request: web.Request) -> web.Response:
        return await answer(request, False)

    async def windows(request: web.Request) -> web.Response:
        return await answer(request, True)

    app = web.Application(middlewares=[authorized])
    app.router.add_get("/tables/{table}/{key}", value)
    app.router.add_get("/tables/{table}/{key}/windows", windows)
    return await serve_app(app, port, host, ssl_context)
