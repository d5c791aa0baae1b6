"""Staging and atomic publication of backfilled stores.

Nothing a backfill does touches the live stores until every new store is complete.
On disk, next to the live stores of the app::

    <state_dir>/<app>/
        processor-<i>/                      live stores (what processors open)
        .backfill/
            lock                            flock: one backfill of this app at a time
            journal.json                    exists only while a publish is in progress
            run-<id>/                       one backfill run (unique per run)
                sst/processor-<i>/<table>/sub-<s>.sst       written by Spark tasks
                stores/processor-<i>/       the new stores, complete, checkpoint stamped
                replaced/processor-<j>/     live stores of processors >= p, set aside

Spark tasks write each SST to an attempt-unique temporary name in a directory the
driver created, and rename it to its deterministic final name (bucket-based, not
attempt-based) only once the file is finished, so a retried or speculative attempt
either replaces it with identical content or leaves only a temporary that the run's
cleanup deletes. Tasks never create directories: a straggler that outlives its run
finds its directory gone and fails without leaving anything.

Publishing (:meth:`Staging.publish`):

1. Lock every live store (the stores' own ``streamkit.lock`` flock). A store held by a
   running processor is refused with :class:`BackfillRefused` naming path and pid;
   nothing has changed at that point.
2. Lock every new store (so no processor can open one before the publish is over).
3. Write ``journal.json`` (atomically) listing the moves.
4. Per processor, swap the new store into place: ``renameat2(RENAME_EXCHANGE)`` swaps
   the two directories atomically (the old store lands in the staging path); with no
   old store it is a plain rename. Live stores of processors beyond the new count
   are moved aside. Each new store carries a marker file naming the run.
5. Remove the journal: that is the commit point. Then release the locks and delete the
   old stores.

Any exception before 5 rolls every move back (in reverse) and removes the journal. If
the process dies between 3 and 5, the journal remains and the next backfill of the app
(or :func:`recover`) rolls the moves back, using the markers to tell which swaps had
happened; the per-processor state is consistent at every instant in between because
each move is a single rename.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stores.base import Checkpoint, StoreLockedError
from stores.rocksdb import LOCK_FILE, RocksDBStore, fsync_dir
from streamkit.errors import StreamkitError

__all__ = [
    "BACKFILL_DIR",
    "MARKER_FILE",
    "BackfillBusy",
    "BackfillError",
    "BackfillRefused",
    "InjectedFailure",
    "Staging",
    "check_fail",
    "check_stores_free",
    "live_store_dirs",
    "lock_store",
    "recover",
]

BACKFILL_DIR = ".backfill"
JOURNAL = "journal.json"
MARKER_FILE = "streamkit.backfill"
FAIL_ENV = "STREAMKIT_BACKFILL_FAIL_AT"


class BackfillError(StreamkitError):
    """A backfill could not be done; the live stores are as they were."""


class BackfillRefused(BackfillError):
    """A live store is held by a running processor (or another backfill runs)."""


class BackfillBusy(BackfillRefused):
    """Another backfill of the same app is running."""


class InjectedFailure(BackfillError):
    """A failure injected on purpose (tests): ``fail_at=`` or ``STREAMKIT_BACKFILL_FAIL_AT``."""


class _SimulatedCrash(BaseException):
    """Injected "process death": skips the rollback, like SIGKILL would (tests only)."""


def check_fail(point: str, fail_at: str | None) -> None:
    """Raise :class:`InjectedFailure` if the failure point ``point`` is selected."""
    selected = fail_at if fail_at is not None else os.environ.get(FAIL_ENV)
    if not selected:
        return
    if point in {s.strip() for s in selected.split(",")}:
        if point.endswith("-crash"):
            raise _SimulatedCrash(point)
        raise InjectedFailure(f"injected failure at {point!r}")


# --------------------------------------------------------------------------- locks


class _Flock:
    """Exclusive non-blocking flock on ``path`` (created if missing), pid written inside."""

    def __init__(self, path: Path, write_pid: bool = True) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            pid = _read_pid(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise _Held(pid) from None
            raise
        if write_pid:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd: int | None = fd

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class _Held(Exception):
    def __init__(self, pid: int | None) -> None:
        self.pid = pid


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def lock_store(path: Path) -> _Flock:
    """Take the store lock of the store directory ``path`` (as a processor would).

    Raises ``StoreLockedError`` (path and holder pid) if a processor holds it.
    """
    try:
        return _Flock(path / LOCK_FILE)
    except _Held as held:
        raise StoreLockedError(str(path), held.pid) from None


def check_stores_free(app_dir: Path, procs: Iterable[int], below: int = 0) -> None:
    """Fail fast (before any work) if a running processor holds a live store that a
    backfill replaces (``procs``) or removes (any other, except those ``< below``)."""
    dirs = live_store_dirs(app_dir)
    others = {path for p, path in dirs.items() if p >= below}
    paths = {dirs.get(p, app_dir / f"processor-{p}") for p in procs} | others
    for path in sorted(paths):
        if path.exists():
            try:
                lock_store(path).release()
            except StoreLockedError as exc:
                raise BackfillRefused(
                    f"store {exc.path} is held by a running processor (pid {exc.pid}); "
                    "stop the app's workers before backfilling"
                ) from None


# --------------------------------------------------------------------------- moves


_libc: Any = None


def _exchange(a: Path, b: Path) -> None:
    """Atomically swap two directory entries (Linux ``renameat2(RENAME_EXCHANGE)``)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(_libc, "renameat2", None)
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"renameat2(RENAME_EXCHANGE) {a} <-> {b}: {os.strerror(err)}")


def _swap(live: Path, staged: Path) -> None:
    """Put ``staged`` at ``live`` and the old ``live`` at ``staged`` (atomic when possible)."""
    try:
        _exchange(live, staged)
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise
        # Filesystem without RENAME_EXCHANGE: two renames through a third name.
        side = staged.with_name(staged.name + ".old")
        os.rename(live, side)
        os.rename(staged, live)
        os.rename(side, staged)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fsync_dir(path.parent)


def _marker_run(store: Path) -> str | None:
    try:
        return json.loads((store / MARKER_FILE).read_text()).get("run")
    except (OSError, ValueError, AttributeError):
        return None


def live_store_dirs(app_dir: Path) -> dict[int, Path]:
    """``{processor id: path}`` of the store directories present under ``app_dir``."""
    found: dict[int, Path] = {}
    if not app_dir.is_dir():
        return found
    for entry in app_dir.iterdir():
        name = entry.name
        if name.startswith("processor-") and entry.is_dir():
            try:
                found[int(name[len("processor-") :])] = entry
            except ValueError:
                continue
    return dict(sorted(found.items()))


@dataclass
class _Move:
    proc: int
    op: str  # "swap" | "create" | "remove"
    live: str
    staged: str  # swap/create: new store (after a swap: old store); remove: where the old one goes

    def to_json(self) -> dict[str, Any]:
        return {"proc": self.proc, "op": self.op, "live": self.live, "staged": self.staged}


def _rollback(run: str, moves: Sequence[_Move]) -> None:
    """Undo ``moves`` (in reverse), judging from the disk which of them happened."""
    for m in reversed(moves):
        live, staged = Path(m.live), Path(m.staged)
        if m.op == "swap":
            if live.exists() and _marker_run(live) == run and staged.exists():
                _swap(live, staged)
        elif m.op == "create":
            if live.exists() and _marker_run(live) == run and not staged.exists():
                os.rename(live, staged)
        elif m.op == "remove":
            if staged.exists() and not live.exists():
                os.rename(staged, live)
    for parent in {Path(m.live).parent for m in moves}:
        if parent.exists():
            fsync_dir(parent)


def recover(app_dir: Path) -> bool:
    """Roll back a publish that a dead process left half done; True if there was one.

    Called by every backfill before it starts (under the backfill lock). Safe to call
    when nothing is pending.
    """
    journal = app_dir / BACKFILL_DIR / JOURNAL
    if not journal.exists():
        return False
    doc = json.loads(journal.read_text())
    moves = [_Move(**m) for m in doc["moves"]]
    _rollback(doc["run"], moves)
    journal.unlink()
    fsync_dir(journal.parent)
    return True


# --------------------------------------------------------------------------- staging


class Staging:
    """One backfill run's staging area; a context manager holding the app's backfill lock."""

    def __init__(self, app_dir: Path, *, fail_at: str | None = None, keep_backup: bool = False) -> None:
        self.app_dir = Path(os.path.abspath(app_dir))
        self.root = self.app_dir / BACKFILL_DIR
        self.run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        self.run_dir = self.root / f"run-{self.run_id}"
        self.fail_at = fail_at
        self.keep_backup = keep_backup
        self.recovered = False
        self._lock: _Flock | None = None

    # -- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> Staging:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self._lock = _Flock(self.root / "lock")
        except _Held as held:
            who = f"pid {held.pid}" if held.pid else "another process"
            raise BackfillBusy(f"another backfill of {self.app_dir} is running ({who})") from None
        try:
            self.recovered = recover(self.app_dir)
            for stale in self.root.glob("run-*"):
                shutil.rmtree(stale, ignore_errors=True)
            (self.run_dir / "sst").mkdir(parents=True)
            (self.run_dir / "stores").mkdir()
            (self.run_dir / "replaced").mkdir()
        except BaseException:
            self._lock.release()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if exc[0] is not None and issubclass(exc[0], _SimulatedCrash):
                return  # a "dead" process cleans nothing up
            shutil.rmtree(self.run_dir, ignore_errors=True)
        finally:
            if self._lock is not None:
                self._lock.release()

    # -- SST files ----------------------------------------------------------------------
    @property
    def sst_root(self) -> Path:
        return self.run_dir / "sst"

    def sst_dir(self, proc: int, table: str) -> Path:
        return self.sst_root / f"processor-{proc}" / table

    def prepare_sst_dirs(self, procs: Iterable[int], tables: Iterable[str]) -> None:
        tables = list(tables)
        for p in procs:
            for t in tables:
                self.sst_dir(p, t).mkdir(parents=True, exist_ok=True)

    def check_live_unlocked(self, procs: Iterable[int], below: int = 0) -> None:
        check_stores_free(self.app_dir, procs, below)

    # -- stores -------------------------------------------------------------------------
    def staged_store(self, proc: int) -> Path:
        return self.run_dir / "stores" / f"processor-{proc}"

    def build_store(
        self, proc: int, tables: Sequence[str], sst_files: Mapping[str, Sequence[str]], checkpoint: Checkpoint
    ) -> Path:
        """Ingest the SST files into a fresh store with ``checkpoint``; returns its path."""
        path = self.staged_store(proc)
        store = RocksDBStore.create_from_sst(str(path), tables, sst_files, checkpoint, move=True)
        store.close()
        marker = {"run": self.run_id, "processor": proc, "created": time.time()}
        _write_atomic(path / MARKER_FILE, json.dumps(marker).encode())
        return path

    def publish(self, count: int, first: int = 0) -> list[Path]:
        """Replace the live stores by the staged stores of processors ``first..count-1``
        (those below ``first`` belong to a running job and are left alone).

        Live stores of processors >= ``count`` are removed too (they would hold state of
        keys that now live elsewhere). Returns the live paths published.
        """
        app_dir = self.app_dir
        existing = live_store_dirs(app_dir)
        moves: list[_Move] = []
        for proc in range(first, count):
            live = app_dir / f"processor-{proc}"
            staged = self.staged_store(proc)
            if not staged.is_dir():
                raise BackfillError(f"internal: staged store for processor {proc} is missing")
            op = "swap" if live.exists() else "create"
            moves.append(_Move(proc, op, str(live), str(staged)))
        for proc, live in existing.items():
            if proc >= count:
                moves.append(_Move(proc, "remove", str(live), str(self.run_dir / "replaced" / live.name)))
        locks: list[_Flock] = []
        journal = self.root / JOURNAL
        try:
            for m in moves:
                live = Path(m.live)
                if live.exists():
                    try:
                        locks.append(lock_store(live))
                    except StoreLockedError as exc:
                        raise BackfillRefused(
                            f"store {exc.path} is held by a running processor (pid {exc.pid}); "
                            "nothing was published, the live stores are unchanged"
                        ) from None
                if m.op != "remove":
                    locks.append(lock_store(Path(m.staged)))
            doc = {"run": self.run_id, "moves": [m.to_json() for m in moves]}
            _write_atomic(journal, json.dumps(doc, indent=1).encode())
            try:
                for i, m in enumerate(moves):
                    live, staged = Path(m.live), Path(m.staged)
                    if m.op == "swap":
                        _swap(live, staged)
                    elif m.op == "create":
                        os.rename(staged, live)
                    else:
                        os.rename(live, staged)
                    if i == 0:
                        check_fail("publish", self.fail_at)
                        check_fail("publish-crash", self.fail_at)
                fsync_dir(app_dir)
                check_fail("before-commit", self.fail_at)
            except _SimulatedCrash:
                raise
            except BaseException:
                _rollback(self.run_id, moves)
                journal.unlink(missing_ok=True)
                fsync_dir(self.root)
                raise
            journal.unlink()  # the commit point
            fsync_dir(self.root)
        finally:
            for lock in locks:
                lock.release()
        if self.keep_backup:
            backup = self.root / f"backup-{self.run_id}"
            backup.mkdir()
            for m in moves:
                if m.op in ("swap", "remove") and Path(m.staged).exists():
                    os.rename(m.staged, backup / Path(m.live).name)
        return [Path(m.live) for m in moves if m.op != "remove"]
