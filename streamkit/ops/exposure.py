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

__all__ = ["dashboard_problem", "loopback", "serving_problem"]


def serving_problem(settings: Settings) -> str | None:
    """What stops a worker from serving as ``settings`` say, in one line (None: nothing)."""
    if settings.query_port is not None and not loopback(settings.query_bind):
        if missing := _missing_beyond(settings):
            return (
                f"query_bind={settings.query_bind!r} serves the tables' state beyond this machine, which needs "
                f"{' and '.join(missing)} (every query must carry the token, and the token must not travel in "
                "clear); or serve at 127.0.0.1"
            )
    if settings.query_port is not None and settings.query_port == settings.metrics_port:
        return f"query_port and metrics_port are both {settings.query_port}: each needs a port of its own"
    return None


def dashboard_problem(settings: Settings, host: str) -> str | None:
    """What stops ``streamkit dashboard --host host`` (None: nothing). The dashboard shows
    the job's status, the first line of its handlers' last errors included: beyond this
    machine it is asked for with the queries' token, over the queries' TLS."""
    if loopback(host):
        return None
    if not (missing := _missing_beyond(settings)):
        return None
    return (
        f"--host {host} shows the job's status beyond this machine, which needs {' and '.join(missing)} (the "
        "page asks with the token, over TLS); or serve at 127.0.0.1"
    )


def _missing_beyond(settings: Settings) -> list[str]:
    """What serving beyond this machine needs and ``settings`` lack: a token that every
    request must carry, and TLS so that it never travels in clear."""
    return [
        name
        for name, absent in (
            ("query_token", settings.query_token is None),
            ("query_tls_certfile and query_tls_keyfile", settings.query_tls_certfile is None),
        )
        if absent
    ]


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
