"""An in-memory :class:`~stores.base.Store` for unit tests.

``MemoryStore(tables)`` is an anonymous store that lives as long as the object.
``MemoryStore.open(path, tables)`` behaves like a store on disk *within this
process*: the contents are kept in a process-wide registry keyed by the
absolute path, survive ``close()``, are found again by a later ``open`` of the
same path, and a second ``open`` while one is open raises
``StoreLockedError`` (holder pid = this process).  This lets the same test
suite exercise reopen and locking semantics on both backends.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Iterator, Sequence

from .base import Changes, Checkpoint, Store, StoreClosedError, StoreError, StoreLockedError, check_bytes, check_changes

__all__ = ["MemoryStore"]


class _Data:
    """The persistent part of a memory store (what a directory is for RocksDB)."""

    __slots__ = ("tables", "checkpoint", "holder")

    def __init__(self) -> None:
        self.tables: dict[str, dict[bytes, bytes]] = {}
        self.checkpoint: bytes = Checkpoint.empty().to_bytes()
        self.holder: MemoryStore | None = None


_REGISTRY: dict[str, _Data] = {}
_REGISTRY_LOCK = threading.Lock()


class MemoryStore(Store):
    """Dict of dicts; sorted iteration; checkpoint kept as its serialised bytes
    (so it round-trips exactly like the RocksDB backend's)."""

    def __init__(self, tables: Sequence[str] = (), *, name: str = "memory") -> None:
        self._init(_Data(), tables, name=name, path=None)

    def _init(self, data: _Data, tables: Sequence[str], *, name: str, path: str | None) -> None:
        self.name = name
        self.path = path
        self._data = data
        self._closed = False
        for table in tables:
            if not isinstance(table, str) or not table:
                raise StoreError(f"table names must be non-empty str, got {table!r}")
            data.tables.setdefault(table, {})
        self._sorted: dict[str, list[bytes]] = {}

    @classmethod
    def open(cls, path: str | os.PathLike[str], tables: Sequence[str] = (), *, create: bool = True) -> MemoryStore:
        """Open (or create) the in-process store registered under ``path``."""
        key = os.path.abspath(os.fspath(path))
        with _REGISTRY_LOCK:
            data = _REGISTRY.get(key)
            if data is None:
                if not create:
                    raise StoreError(f"store {key} does not exist (create=False)")
                data = _REGISTRY[key] = _Data()
            if data.holder is not None:
                raise StoreLockedError(key, os.getpid())
            store = cls.__new__(cls)
            store._init(data, tables, name=os.path.basename(key) or key, path=key)
            data.holder = store
        return store

    @staticmethod
    def destroy(path: str | os.PathLike[str]) -> None:
        """Forget the registered store at ``path`` (it must not be open)."""
        key = os.path.abspath(os.fspath(path))
        with _REGISTRY_LOCK:
            data = _REGISTRY.get(key)
            if data is not None and data.holder is not None:
                raise StoreLockedError(key, os.getpid())
            _REGISTRY.pop(key, None)

    # -- reads ---------------------------------------------------------------

    def _table(self, table: str) -> dict[bytes, bytes]:
        if self._closed:
            raise StoreClosedError(f"store {self.path or self.name} is closed")
        try:
            return self._data.tables[table]
        except KeyError:
            known = ", ".join(sorted(self._data.tables)) or "none"
            raise StoreError(f"unknown table {table!r} (tables: {known})") from None

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(sorted(self._data.tables))

    @property
    def closed(self) -> bool:
        return self._closed

    def get(self, table: str, key: bytes) -> bytes | None:
        return self._table(table).get(key)

    def get_many(self, table: str, keys: Sequence[bytes]) -> list[bytes | None]:
        get = self._table(table).get
        return [get(k) for k in keys]

    def items(self, table: str, start: bytes | None = None, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        data = self._table(table)
        keys = self._sorted.get(table)
        if keys is None:
            keys = self._sorted[table] = sorted(data)
        lo = 0 if start is None else bisect.bisect_left(keys, start)
        hi = len(keys) if end is None else bisect.bisect_left(keys, end)
        # Materialise now: the iteration must not see later commits.
        return iter([(k, data[k]) for k in keys[lo:hi]])

    def checkpoint(self) -> Checkpoint:
        if self._closed:
            raise StoreClosedError(f"store {self.path or self.name} is closed")
        return Checkpoint.from_bytes(self._data.checkpoint)

    # -- the one write -------------------------------------------------------

    def commit(self, changes: Changes, checkpoint: Checkpoint) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.path or self.name} is closed")
        check_changes(changes, self._data.tables)
        for table, kv in changes.items():
            for k, v in kv.items():
                check_bytes(table, k, v)
        cp = checkpoint.to_bytes()  # may raise: still nothing applied
        for table, kv in changes.items():
            if not kv:
                continue
            data = self._data.tables[table]
            for k, v in kv.items():
                if v is None:
                    data.pop(k, None)
                else:
                    data[k] = v
            self._sorted.pop(table, None)
        self._data.checkpoint = cp

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with _REGISTRY_LOCK:
            if self._data.holder is self:
                self._data.holder = None
