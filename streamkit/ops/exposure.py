"""What a worker may serve, and to whom: the queries of its tables' state beyond this
machine only with a token and TLS, and each server on a port of its own.

Asked when a worker starts (``streamkit worker``, ``runtime.worker.Worker.run``), not
when an App is declared: the commands that only read a job (``status``, ``query``) load
the same App and serve nothing.
"""

from __future__ import annotations

import ipaddress
import socket

from streamkit.settings import Settings

__all__ = ["loopback", "serving_problem"]


def serving_problem(settings: Settings) -> str | None:
    """What stops a worker from serving as ``settings`` say, in one line (None: nothing)."""
    if settings.query_port is not None and not loopback(settings.query_bind):
        missing = [
            name
            for name, absent in (
                ("query_token", settings.query_token is None),
                ("query_tls_certfile and query_tls_keyfile", settings.query_tls_certfile is None),
            )
            if absent
        ]
        if missing:
            return (
                f"query_bind={settings.query_bind!r} serves the tables' state beyond this machine, which needs "
                f"{' and '.join(missing)} (every query must carry the token, and the token must not travel in "
                "clear); or serve at 127.0.0.1"
            )
    if settings.query_port is not None and settings.query_port == settings.metrics_port:
        return f"query_port and metrics_port are both {settings.query_port}: each needs a port of its own"
    return None


def loopback(address: str) -> bool:
    """Whether serving at ``address`` reaches this machine only (``localhost`` when every
    address it resolves to is a loopback one)."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name: whatever it resolves to may be reached from elsewhere
        pass
    if address.lower() != "localhost":
        return False
    try:
        found = {str(info[4][0]) for info in socket.getaddrinfo(address, None)}
    except OSError:
        return False
    return bool(found) and all(ipaddress.ip_address(a.partition("%")[0]).is_loopback for a in found)
