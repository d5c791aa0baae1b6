"""A client for queries of a running job's state by key (``App(query_port=...)``).

    async with Client("http://worker-1:9500") as client:     # any worker of the job
        answer = await client.get("totals", "customer-7")     # {"value": ..., "processor": ..., ...}

Any worker answers for every key (it forwards to the one hosting the key's processor).
A 503 (a rebalance or a handover under way) is asked again after its ``Retry-After``,
``retries`` times at most. ``token``: the workers' ``query_token`` (sent as
``Authorization: Bearer``); ``cafile``: the CA bundle (PEM) an ``https`` worker's
certificate is checked against (None: the system's trusted CAs).
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.parse
from pathlib import Path
from typing import Any

from aiohttp import ClientConnectorCertificateError, ClientError, ClientSSLError
from pydantic import SecretStr

from streamkit.errors import ConfigError, StreamkitError
from streamkit.kafkaio import KafkaIO
from streamkit.ops.queries import ask, client_tls

__all__ = ["Client", "QueryError", "query_url"]


class QueryError(StreamkitError):
    """A query was refused (unknown table, bad key) or still unanswered after its retries;
    ``status``: the worker's HTTP status (0: no worker answered)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Client:
    def __init__(
        self,
        url: str,
        *,
        retries: int = 10,
        timeout: float = 5.0,
        token: str | SecretStr | None = None,
        cafile: str | Path | None = None,
    ) -> None:
        self.url, self.retries, self.timeout = url.rstrip("/"), retries, timeout
        self._token = token.get_secret_value() if isinstance(token, SecretStr) else token
        self._tls: ssl.SSLContext | None = None
        if self.url.startswith("https:"):
            try:
                self._tls = client_tls(str(cafile) if cafile is not None else None)
            except ConfigError as exc:
                raise QueryError(str(exc)) from None

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def get(self, table: str, key: str) -> dict[str, Any]:
        """The answer for ``key`` of ``table``: its value (None if absent), the processor and
        worker that answered, and that processor's input positions."""
        return await self._ask(f"{self.url}/tables/{urllib.parse.quote(table)}/{urllib.parse.quote(key, safe='')}")

    async def windows(self, table: str, key: str) -> dict[str, Any]:
        """The answer for ``key`` of the windowed table ``table``: every window the
        processor holds for it (``windows``: start and end in ms, value; by start), with
        the processor's stream time and input positions."""
        quoted = urllib.parse.quote(key, safe="")
        return await self._ask(f"{self.url}/tables/{urllib.parse.quote(table)}/{quoted}/windows")

    async def _ask(self, url: str) -> dict[str, Any]:
        answer: object = None
        for attempt in range(self.retries + 1):
            try:
                answer = await ask(url, self.timeout, token=self._token, ssl_context=self._tls)
            except ClientConnectorCertificateError as exc:  # before OSError: it is one too
                why = getattr(exc.certificate_error, "verify_message", None) or exc.certificate_error
                raise QueryError(f"{self.url}: its TLS certificate is not trusted: {why}") from None
            except ClientSSLError as exc:
                why = getattr(exc.os_error, "reason", None) or exc.os_error.strerror or "handshake failed"
                raise QueryError(f"{self.url}: TLS failed: {why}") from None
            except (OSError, TimeoutError, ClientError) as exc:  # the worker is not reachable (now)
                raise QueryError(f"{self.url} did not answer: {exc or type(exc).__name__}") from None
            if answer.status == 200:
                return answer.body
            if answer.status != 503 or attempt == self.retries:
                raise QueryError(str(answer.body.get("error", answer.body)), answer.status)
            await asyncio.sleep(answer.retry_after or 0.5)
        raise QueryError(f"{url}: no answer after {self.retries} retries ({answer})", 503)


async def query_url(io: KafkaIO, app_name: str) -> str:
    """The query URL of a live worker of ``app_name`` (from the workers' heartbeats)."""
    from streamkit.runtime.status import read_statuses

    urls = [s.query_url for s in await read_statuses(io, app_name) if s.alive and not s.stale and s.query_url]
    if not urls:
        raise QueryError(f"no live worker of {app_name!r} answers queries (start workers with --query-port)")
    return urls[0]
