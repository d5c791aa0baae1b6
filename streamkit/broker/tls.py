"""A TLS-terminating proxy in front of the embedded broker.

Tansu 0.6's own TLS options do not work together (``--cert`` with ``--key`` is refused
as conflicting; ``--cert`` alone opens a listener no TLS client can talk to), so a
secured embedded broker is Tansu on a loopback port behind this proxy, advertising the
proxy's address: clients connect with TLS (optionally presenting a certificate, for
mutual TLS) and the proxy passes the bytes on in plain text.

The proxy runs its own event loop in a daemon thread, so that a synchronous caller
(``EmbeddedBroker``, the ``streamkit broker`` command, a test fixture) can own it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading

__all__ = ["TlsProxy"]

log = logging.getLogger(__name__)


class TlsProxy:
    """Accepts TLS on ``host:port`` (a free port unless given) and forwards to ``target``."""

    def __init__(
        self, certfile: str, keyfile: str, *, host: str = "127.0.0.1", client_cafile: str | None = None
    ) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(certfile, keyfile)
        if client_cafile:  # mutual TLS: clients must present a certificate this CA signed
            self.context.load_verify_locations(client_cafile)
            self.context.verify_mode = ssl.CERT_REQUIRED
        self._sock = socket.create_server((host, 0))
        self.host, self.port = host, self._sock.getsockname()[1]
        self.target: tuple[str, int] | None = None
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(self._quiet)
        self._thread = threading.Thread(target=self._loop.run_forever, name="streamkit-tls-proxy", daemon=True)
        self._server: asyncio.Server | None = None

    def start(self, target: tuple[str, int]) -> TlsProxy:
        self.target = target
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        fut.result(10)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            self._sock.close()
            return
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _serve(self) -> None:
        self._server = await asyncio.start_server(self._pipe, sock=self._sock, ssl=self.context)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._server.wait_closed()

    async def _pipe(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        assert self.target is not None
        try:
            broker_r, broker_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return

        async def copy(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(1 << 16):
                    w.write(data)
                    await w.drain()
            except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    w.close()

        await asyncio.gather(copy(client_r, broker_w), copy(broker_r, client_w))

    @staticmethod
    def _quiet(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        """A client that gives up its handshake (untrusted certificate) is its business."""
        log.debug("tls proxy: %s", context.get("message"))
