"""A port for a server a test starts (a dashboard, metrics, queries, a broker of a pasted
command)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["listen_port"]

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
SPAN = 12_000
"""How many ports below the ephemeral range the choice is made from."""


def listen_port() -> int:
    """A port free now, below the kernel's ephemeral range. Every outgoing connection (a
    Kafka client's, a browser's) takes its local port from that range, so a port chosen
    in it (bind to port 0) can be taken by one of them before the server binds it, and the
    server then fails with "address already in use"."""
    try:
        low = int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):  # not Linux: the IANA range's start
        low = 49152
    for _ in range(200):
        port = random.randrange(max(1024, low - SPAN), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port below {low} after 200 tries")
