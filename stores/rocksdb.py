"""RocksDB store on rocksdict, in raw mode (bytes in, bytes out, no pickling).

Layout on disk (one directory per store)::

    <path>/              the RocksDB database
        column family "t:<table>"   one per table
        column family "default"     reserved keys: the checkpoint and the format
        streamkit.lock              holder pid, flock()ed while open

Atomicity.  ``commit`` puts every change of every table and the checkpoint
into one ``WriteBatch`` (with the column-family handles) and writes it with
one ``DB::Write``.  A write batch is a single record in the write-ahead log,
protected by a checksum, and recovery (point-in-time mode, the default)
replays whole records only: after a crash the store holds a commit entirely
or not at all.  Multi-column-family atomicity needs the WAL (or
``atomic_flush`` without it); the WAL is always on here.

Sync policy.  ``sync=False`` (default): ``DB::Write`` hands the WAL record to
the kernel (``write(2)``) before it returns, because RocksDB's
``manual_wal_flush`` is off.  A record in the page cache survives the death
of the *process* (SIGKILL, segfault, OOM kill): the crash test in
``tests/stores`` kills writers at random instants and checks exactly that.
Only a kernel crash or power loss can lose it, and then point-in-time recovery
drops a *suffix* of commits, never part of one, so the store is consistent but
older and the processor simply re-reads from that older position.
``sync=True`` adds an fsync of the WAL per commit (milliseconds on real disks)
for callers that want commits to survive power loss too.

Locking.  ``open`` takes ``flock(LOCK_EX | LOCK_NB)`` on ``streamkit.lock``
*before* opening RocksDB and writes its pid there.  A second opener, in
another process or in this one (flock locks belong to open file descriptions,
so a second ``open`` in the same process conflicts too), fails at once with
``StoreLockedError`` naming the path and the holder's pid.  The kernel drops
the lock when the holder dies, so a SIGKILLed processor never blocks its
restart.  The lock file descriptor is closed in forked children so that a
child does not keep the lock alive; a store must not be used in a forked
child (``close()`` there only drops the handle, leaving the parent's files
alone): the child opens its own after the parent lets go.
"""

from __future__ import annotations

import itertools
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

from rocksdict import IngestExternalFileOptions, Options, Rdict, SstFileWriter, WriteBatch, WriteOptions

from .base import Changes, Checkpoint, Store, StoreClosedError, StoreError, StoreLockedError, check_changes
from .locking import PidLock
from .rocksdb_options import Configure, SharedMemory, store_options
from .serde import short_repr

__all__ = ["LOCK_FILE", "RocksDBStore", "SharedMemory", "fsync_dir", "store_options", "write_sst"]

LOCK_FILE = "streamkit.lock"
CHECKPOINT_KEY = b"streamkit/checkpoint"
FORMAT_KEY = b"streamkit/format"
FORMAT = b"1"
CF_PREFIX = "t:"

# --------------------------------------------------------------------------- lock


# --------------------------------------------------------------------------- store

#: Databases inherited through fork() and "closed" in the child: kept referenced
#: so that the child never runs RocksDB's shutdown on the parent's files.
_FORKED_HANDLES: list[Any] = []


class PreparedCommit:
    """A store's write batch built by :meth:`RocksDBStore.prepare`, not written yet."""

    def __init__(self, store: RocksDBStore, batch: WriteBatch) -> None:
        self._store, self._batch = store, batch

    def finish(self, checkpoint: Checkpoint) -> None:
        """Write the batch and ``checkpoint`` in one atomic write."""
        self._store._write(self._batch, checkpoint)


class RocksDBStore(Store):
    """A :class:`~stores.base.Store` in one RocksDB directory.  Use :meth:`open`."""

    def __init__(self) -> None:  # pragma: no cover - guidance only
        raise TypeError("use RocksDBStore.open(path, tables) or RocksDBStore.create_from_sst(...)")

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        tables: Sequence[str] = (),
        *,
        create: bool = True,
        sync: bool = False,
        configure: Configure | None = None,
        name: str | None = None,
    ) -> RocksDBStore:
        """Open the store at ``path``, creating it (``create=True``) and any table
        of ``tables`` it lacks.  Tables created earlier and not listed stay
        available.  ``sync``: fsync the WAL at every commit (see module doc).
        ``configure`` may tune the raw-mode ``Options`` before the open."""
        path = os.path.abspath(os.fspath(path))
        for table in tables:
            if not isinstance(table, str) or not table:
                raise StoreError(f"table names must be non-empty str, got {table!r}")
        exists = os.path.exists(os.path.join(path, "CURRENT"))
        if not exists:
            if not create:
                raise StoreError(f"store {path} does not exist (create=False)")
            os.makedirs(path, exist_ok=True)
        lock = PidLock(os.path.join(path, LOCK_FILE), path)
        try:
            opts = store_options(configure)
            cf_names = set(Rdict.list_cf(path, opts)) if exists else set()
            cf_names.update(CF_PREFIX + t for t in tables)
            cf_names.discard("default")
            try:
                db = Rdict(path, opts, column_families={n: opts for n in sorted(cf_names)})
            except Exception as exc:  # rocksdict raises bare Exception
                if "lock" in str(exc).lower():
                    # RocksDB's own LOCK: still held inside this process (e.g. an
                    # iterator of a closed handle keeps the DB alive).
                    raise StoreLockedError(path, os.getpid()) from exc
                raise StoreError(f"cannot open store {path}: {exc}") from exc
        except BaseException:
            lock.release()
            raise
        self = cls.__new__(cls)
        try:
            self._setup(db, opts, lock, path, name, sync, cf_names)
        except BaseException:
            self.close()
            raise
        return self

    def _setup(
        self, db: Rdict, opts: Options, lock: PidLock, path: str, name: str | None, sync: bool, cf_names: set[str]
    ) -> None:
        self.path = path
        self.name = name or os.path.basename(path) or path
        self.sync = sync
        self._db: Rdict | None = db
        self._opts = opts
        self._lock = lock
        self._cfs: dict[str, Rdict] = {}
        self._handles: dict[str, Any] = {}
        self._write_opts = WriteOptions()
        self._write_opts.sync = sync
        for cf in sorted(cf_names):
            if cf.startswith(CF_PREFIX):
                table = cf[len(CF_PREFIX) :]
                self._cfs[table] = db.get_column_family(cf)
                self._handles[table] = db.get_column_family_handle(cf)
        fmt = db.get(FORMAT_KEY)
        if fmt is None:
            db.put(FORMAT_KEY, FORMAT)
        elif fmt != FORMAT:
            raise StoreError(f"store {path} has format {fmt!r}, this code reads {FORMAT!r}")
        cp = db.get(CHECKPOINT_KEY)
        if cp is not None:
            Checkpoint.from_bytes(cp)  # fail at open, not at first use, if corrupt
        self._checkpoint_bytes: bytes = cp if cp is not None else Checkpoint.empty().to_bytes()

    # -- reads ---------------------------------------------------------------

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(sorted(self._cfs))

    @property
    def closed(self) -> bool:
        return self._db is None

    def _missing(self, table: str) -> StoreError:
        if self._db is None:
            return StoreClosedError(f"store {self.path} is closed")
        known = ", ".join(sorted(self._cfs)) or "none"
        return StoreError(f"unknown table {table!r} in store {self.path} (tables: {known})")

    def get(self, table: str, key: bytes) -> bytes | None:
        try:
            cf = self._cfs[table]
        except KeyError:
            raise self._missing(table) from None
        try:
            return cf.get(key)
        except KeyError:  # rocksdict's complaint about a non-bytes key
            raise TypeError(f"table {table!r}: keys must be bytes, got {type(key).__name__}") from None

    def table_size(self, table: str) -> tuple[int, int]:
        """RocksDB's estimate of the keys ``table`` holds, and its bytes (SST files and
        memtables of its column family)."""
        try:
            cf = self._cfs[table]
        except KeyError:
            raise self._missing(table) from None
        keys = cf.property_int_value("rocksdb.estimate-num-keys") or 0
        size = (cf.property_int_value("rocksdb.total-sst-files-size") or 0) + (
            cf.property_int_value("rocksdb.cur-size-all-mem-tables") or 0
        )
        return int(keys), int(size)

    def get_many(self, table: str, keys: Sequence[bytes]) -> list[bytes | None]:
        try:
            cf = self._cfs[table]
        except KeyError:
            raise self._missing(table) from None
        if not keys:
            return []
        try:
            return cast("list[bytes | None]", cf.get(list(keys)))
        except KeyError:
            raise TypeError(f"table {table!r}: keys must be bytes") from None

    def items(self, table: str, start: bytes | None = None, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        try:
            cf = self._cfs[table]
        except KeyError:
            raise self._missing(table) from None
        # The RocksDB iterator is created here, so it sees the store as of this call. The end
        # is checked here too, not given to RocksDB as the read's upper bound: rocksdict hands
        # RocksDB a pointer into the bound's bytes, not a copy, and a caller's temporary bound
        # is freed while the scan goes on; its memory, reused for a key read, ended the scan
        # early (a key's windows after its first one went missing).
        found = cast("Iterator[tuple[bytes, bytes]]", iter(cf.items(from_key=start)))
        if end is None:
            return found
        return itertools.takewhile(lambda item: item[0] < end, found)

    def checkpoint(self) -> Checkpoint:
        if self._db is None:
            raise StoreClosedError(f"store {self.path} is closed")
        return Checkpoint.from_bytes(self._checkpoint_bytes)

    # -- the one write -------------------------------------------------------

    def commit(self, changes: Changes, checkpoint: Checkpoint) -> None:
        self.prepare(changes).finish(checkpoint)

    def prepare(self, changes: Changes) -> PreparedCommit:
        """The write batch of ``changes``, built now (each value serialised as it goes
        in, once), written with its checkpoint by :meth:`PreparedCommit.finish`: a caller
        that must do something between the two (write a changelog) holds no serialised
        value meanwhile. Nothing is written until then."""
        if self._db is None:
            raise StoreClosedError(f"store {self.path} is closed")
        check_changes(changes, self._handles)
        batch = WriteBatch(raw_mode=True)
        put = batch.put
        delete = batch.delete
        for table, kv in changes.items():
            handle = self._handles[table]
            try:
                if (write_to := getattr(kv, "write_to", None)) is not None:  # serialised as written
                    write_to(put, delete, handle)
                    continue
                for k, v in kv.items():
                    if v is None:
                        delete(k, handle)
                    else:
                        put(k, v, handle)
            except (KeyError, ValueError) as exc:  # rocksdict: non-bytes key / value
                raise TypeError(
                    f"table {table!r}: keys must be bytes and values bytes or None ({exc}); nothing was written"
                ) from None
        return PreparedCommit(self, batch)

    def _write(self, batch: WriteBatch, checkpoint: Checkpoint) -> None:
        db = self._db
        if db is None:
            raise StoreClosedError(f"store {self.path} is closed")
        cp = checkpoint.to_bytes()
        batch.put(CHECKPOINT_KEY, cp)  # default column family
        try:
            db.write(batch, self._write_opts)
        except Exception as exc:
            raise StoreError(f"commit to store {self.path} failed: {exc}") from exc
        self._checkpoint_bytes = cp

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        db = self._db
        if db is None:
            return
        self._db = None
        if os.getpid() != self._lock.owner_pid:
            # A forked child must not flush or close the parent's database:
            # keep the handles alive (never dropped) and touch nothing.
            _FORKED_HANDLES.append((db, dict(self._cfs), dict(self._handles)))
            self._cfs.clear()
            self._handles.clear()
            return
        self._cfs.clear()
        self._handles.clear()
        try:
            db.close()
        finally:
            del db
            self._lock.release()

    def __del__(self) -> None:
        # Best effort; a dying process releases the lock anyway.
        try:
            if getattr(self, "_db", None) is not None:
                self.close()
        except Exception:
            pass

    # -- bulk load ---------------------------------------------------------------

    @classmethod
    def create_from_sst(
        cls,
        path: str | os.PathLike[str],
        tables: Sequence[str],
        sst_files: Mapping[str, Sequence[str | os.PathLike[str]]],
        checkpoint: Checkpoint,
        *,
        move: bool = False,
        sync: bool = False,
        configure: Configure | None = None,
    ) -> RocksDBStore:
        """Build a new store at ``path`` from SST files and return it open.

        ``sst_files[table]`` are files written by :func:`write_sst`; keys may
        appear in only one file of a table.  The store is built in a sibling
        temporary directory and renamed into place once complete (tables
        ingested, ``checkpoint`` stamped, RocksDB closed), so ``path`` never
        holds a half-built store: after a crash it is absent (a stale
        ``<path>.building-*`` directory may remain and can be deleted).
        ``move=True`` moves (hard-links) the files instead of copying them.
        """
        path = os.path.abspath(os.fspath(path))
        if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
            raise StoreError(f"cannot create store {path} from SST files: it already exists")
        unknown = set(sst_files) - set(tables)
        if unknown:
            raise StoreError(f"SST files given for tables not in {sorted(tables)}: {sorted(unknown)}")
        for table, files in sst_files.items():
            for f in files:
                if not os.path.isfile(f):
                    raise StoreError(f"SST file for table {table!r} not found: {os.fspath(f)}")
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        tmp = f"{path}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        store = cls.open(tmp, tables, create=True, sync=True, configure=configure)
        try:
            ingest_opts = IngestExternalFileOptions()
            ingest_opts.set_move_files(move)
            for table, files in sst_files.items():
                if files:
                    try:
                        store._cfs[table].ingest_external_file([os.fspath(f) for f in files], ingest_opts)
                    except Exception as exc:
                        raise StoreError(f"ingesting SST files into table {table!r} failed: {exc}") from exc
            store.commit({}, checkpoint)
            store.close()
            os.rename(tmp, path)  # atomic; replaces an empty directory at path
            fsync_dir(parent)
        except BaseException:
            store.close()
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return cls.open(path, tables, create=False, sync=sync, configure=configure)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or a new entry in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_sst(
    path: str | os.PathLike[str],
    sorted_items: Iterable[tuple[bytes, bytes]],
    options: Options | None = None,
) -> int:
    """Write ``(key, value)`` pairs, in strictly ascending key order, to an SST
    file for :meth:`RocksDBStore.create_from_sst`; returns the number written.

    ``options`` must be raw mode (default: :func:`store_options`).  An SST
    written without raw mode carries rocksdict's type-tagged key encoding and
    its own comparator; ``create_from_sst`` then fails with a comparator
    mismatch (tested) rather than storing unreadable keys.  RocksDB cannot write an empty SST:
    with no items no file is left behind and 0 is returned.
    """
    path = os.fspath(path)
    writer = SstFileWriter(options if options is not None else store_options())
    writer.open(path)
    try:
        n = _append_sorted(writer, path, sorted_items)
        if n:
            writer.finish()
    except BaseException:
        del writer  # the file is closed before it is removed
        _remove_quietly(path)
        raise
    if n == 0:
        del writer  # RocksDB refuses to finish an empty SST
        _remove_quietly(path)
    return n


def _append_sorted(writer: SstFileWriter, path: str, sorted_items: Iterable[tuple[bytes, bytes]]) -> int:
    n = 0
    last: bytes | None = None
    for key, value in sorted_items:
        try:
            writer[key] = value
        except KeyError:
            raise TypeError(f"write_sst {path}: keys must be bytes, got {type(key).__name__}") from None
        except ValueError:
            raise TypeError(f"write_sst {path}: values must be bytes, got {type(value).__name__}") from None
        except Exception as exc:
            raise StoreError(
                f"write_sst {path}: key {short_repr(key)} after {short_repr(last)}: {exc} "
                "(keys must be strictly ascending bytes)"
            ) from None
        last = key
        n += 1
    return n


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
