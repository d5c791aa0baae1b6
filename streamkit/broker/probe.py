"""Is a Kafka-protocol broker answering at an address? (an ``ApiVersions`` round trip)."""

from __future__ import annotations

import socket
import struct
import time

__all__ = ["API_VERSIONS_KEY", "BrokerError", "api_versions", "parse_address", "wait_for_broker"]

API_VERSIONS_KEY = 18
STARTUP_TIMEOUT = 10.0


class BrokerError(RuntimeError):
    """A broker could not be started or reached. The message is one readable line."""


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (optionally ``tcp://`` or ``kafka://`` prefixed, or a comma list:
    the first entry is used) -> (host, port)."""
    first = address.strip().split(",")[0].strip()
    for prefix in ("tcp://", "kafka://", "plaintext://", "PLAINTEXT://"):
        if first.startswith(prefix):
            first = first[len(prefix) :]
    first = first.rstrip("/")
    host, sep, port = first.rpartition(":")
    if not sep or not port.isdigit():
        raise BrokerError(f"invalid broker address {address!r}: expected host:port")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def api_versions(address: str, timeout: float = 2.0) -> dict[int, tuple[int, int]]:
    """Send one ``ApiVersions`` v0 request and return ``{api_key: (min, max)}``.

    Raises ``OSError``/``ConnectionError`` when nothing (or not a Kafka broker) answers.
    """
    host, port = parse_address(address)
    client_id = b"streamkit"
    correlation_id = 0x5354524B  # "STRK"
    body = struct.pack(">hhih", API_VERSIONS_KEY, 0, correlation_id, len(client_id)) + client_id
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        if not 10 <= size <= 1 << 20:
            raise ConnectionError(f"not a Kafka ApiVersions response (size {size})")
        data = _recv_exact(sock, size)
    corr, error, count = struct.unpack_from(">ihi", data, 0)
    if corr != correlation_id:
        raise ConnectionError("not a Kafka ApiVersions response (correlation id mismatch)")
    if error != 0:
        raise ConnectionError(f"ApiVersions answered with error code {error}")
    if count < 0 or 10 + 6 * count > len(data):
        raise ConnectionError("malformed ApiVersions response")
    versions = {}
    for i in range(count):
        key, lo, hi = struct.unpack_from(">hhh", data, 10 + 6 * i)
        versions[key] = (lo, hi)
    return versions


def wait_for_broker(address: str, timeout: float = STARTUP_TIMEOUT) -> dict[int, tuple[int, int]]:
    """Poll ``address`` with ApiVersions until it answers or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        try:
            return api_versions(address, timeout=min(1.0, max(0.05, deadline - time.monotonic())))
        except (OSError, ConnectionError) as exc:
            if time.monotonic() + delay >= deadline:
                raise BrokerError(f"no Kafka broker answers at {address} ({describe_error(exc)})") from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, socket.gaierror):
        return f"unknown host: {exc.strerror}"
    return str(exc) or type(exc).__name__
