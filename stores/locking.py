"""The lock that keeps a store to one opener: an exclusive, non-blocking ``flock`` on a
file in the store's directory that names the holder's pid.

The lock dies with its process (the kernel drops it), so a crashed worker never leaves
a store locked. A forked child closes its inherited copies of the descriptors at fork
(closing, not unlocking: the parent keeps its lock).
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time

from .base import StoreError, StoreLockedError

__all__ = ["PidLock", "read_holder_pid"]

_LIVE_LOCK_FDS: set[int] = set()
_LIVE_LOCK_FDS_MUTEX = threading.Lock()


def _close_lock_fds_in_child() -> None:
    # Closing (not unlocking) our copy leaves the parent's lock in place.
    for fd in list(_LIVE_LOCK_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _LIVE_LOCK_FDS.clear()


os.register_at_fork(after_in_child=_close_lock_fds_in_child)


class PidLock:
    """An exclusive, non-blocking flock on a file that names the holder's pid."""

    def __init__(self, lock_path: str, store_path: str) -> None:
        self.lock_path = lock_path
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            try:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise StoreLockedError(store_path, read_holder_pid(fd)) from None
                raise StoreError(f"cannot lock store {store_path}: {exc}") from exc
            finally:
                os.close(fd)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            os.close(fd)
            raise
        self.fd: int | None = fd
        self.owner_pid = os.getpid()
        with _LIVE_LOCK_FDS_MUTEX:
            _LIVE_LOCK_FDS.add(fd)

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is None or os.getpid() != self.owner_pid:
            return  # in a forked child the descriptor was closed at fork (and its number may be reused)
        with _LIVE_LOCK_FDS_MUTEX:
            _LIVE_LOCK_FDS.discard(fd)
        os.close(fd)  # closing the only descriptor releases the flock


def read_holder_pid(fd: int) -> int | None:
    """The pid in the lock file; the holder writes it right after locking, so
    an empty file is retried for a few milliseconds (never more)."""
    for _ in range(20):
        try:
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        except OSError:
            return None
        if text:
            try:
                return int(text)
            except ValueError:
                return None
        time.sleep(0.001)
    return None
