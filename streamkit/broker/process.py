"""Process helpers of the embedded broker: a free port, who listens on it, and a child
that dies with its parent."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable

__all__ = ["free_port", "listens_on", "die_with_parent"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds a socket listening on ``port`` (Linux /proc).

    Guards against a race on the chosen port: another broker (another test run, another
    engineer's benchmark) may bind it first, and would then answer our readiness probe.
    Returns None when this cannot be checked (not Linux).
    """
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        listening = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(OSError), open(table) as fh:
                next(fh, None)
                for line in fh:
                    fields = line.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        listening.add(inode)
    except OSError:
        return None
    return bool(inodes & listening)


def die_with_parent(sig: int = signal.SIGKILL, *, pool_thread: bool = False) -> Callable[[], None] | None:
    """On Linux, ask the kernel to send the child ``sig`` when its parent dies (even by
    SIGKILL): a preexec function for ``subprocess.Popen``.

    PR_SET_PDEATHSIG fires when the *thread* that forked exits, so it is only used when
    the child is started from the main thread, or (``pool_thread``) from a thread of a
    pool that lives as long as the process (asyncio's default executor).
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread() and not pool_thread:
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = ctypes.c_int(1)
    death = ctypes.c_ulong(sig)
    parent = os.getpid()

    def preexec() -> None:  # runs in the child between fork and exec: keep it minimal
        prctl(pr_set_pdeathsig, death)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec
