"""The store contract: a checkpoint record and the abstract ``Store``.

A store belongs to one processor and holds several named tables of
bytes -> bytes.  Its only write operation is :meth:`Store.commit`, which
applies the changes of every table *and* the new :class:`Checkpoint` in one
atomic step.  That pairing is what makes recovery exact: after a crash the
store's contents are precisely the effect of the input before
``checkpoint().positions``, so the processor resumes reading there and no
record is lost or applied twice.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import orjson

__all__ = [
    "Changes",
    "Checkpoint",
    "Store",
    "StoreClosedError",
    "StoreError",
    "StoreLockedError",
]

#: ``{table: {key: value or None (= delete)}}``, the argument of :meth:`Store.commit`. A
#: table's mapping may also offer ``write_to(put, delete, cf)`` (``cache.PendingChanges``):
#: a backend that writes one change at a time may call it instead of iterating.
Changes = Mapping[str, Mapping[bytes, "bytes | None"]]

_CHECKPOINT_FORMAT = 1


class StoreError(Exception):
    """Any failure of a store: missing store, unknown table, bad arguments, I/O."""


class StoreLockedError(StoreError):
    """The store is open elsewhere (another process, or another handle in this one)."""

    def __init__(self, path: str, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        holder = f"pid {pid}" if pid is not None else "a process whose pid is not yet recorded"
        super().__init__(f"store {path} is locked by {holder}")


class StoreClosedError(StoreError):
    """An operation on a store after ``close()``."""


@dataclass(frozen=True)
class Checkpoint:
    """What a store's contents correspond to, committed atomically with them.

    - ``positions``: per ``(topic, partition)``, the next offset to read; every
      record before it is reflected in the store, none after it.
    - ``layout_epochs``: per topic, the layout epoch the positions refer to.
    - ``generation``: the consumer-group generation of the commit (-1 = none).
    - ``ic_ranges``: per ``(topic, partition)``, inclusive ``(first, last)``
      offset ranges already processed *beyond* the position (shared tasks).
    - ``extra``: anything JSON-serialisable the runtime wants to keep.

    Treat instances as immutable (the dicts are not copied); derive new ones with
    :meth:`replace`.  ``to_bytes`` is deterministic: equal checkpoints give equal bytes.
    """

    positions: dict[tuple[str, int], int] = field(default_factory=dict)
    layout_epochs: dict[str, int] = field(default_factory=dict)
    generation: int = -1
    ic_ranges: dict[tuple[str, int], list[tuple[int, int]]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> Checkpoint:
        """The checkpoint of a store nothing was committed to."""
        return cls()

    def is_empty(self) -> bool:
        return self == _EMPTY

    def position(self, topic: str, partition: int, default: int = 0) -> int:
        """The next offset to read for ``(topic, partition)``."""
        return self.positions.get((topic, partition), default)

    def replace(self, **changes: Any) -> Checkpoint:
        """A copy with some fields replaced (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def to_bytes(self) -> bytes:
        """Stable JSON: tuple-keyed maps become sorted lists, dict keys sorted."""
        doc = {
            "format": _CHECKPOINT_FORMAT,
            "positions": sorted([t, int(p), int(o)] for (t, p), o in self.positions.items()),
            "layout_epochs": {t: int(e) for t, e in self.layout_epochs.items()},
            "generation": int(self.generation),
            "ic_ranges": sorted(
                [t, int(p), [[int(a), int(b)] for a, b in ranges]] for (t, p), ranges in self.ic_ranges.items()
            ),
            "extra": self.extra,
        }
        try:
            return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
        except TypeError as exc:
            raise StoreError(f"checkpoint is not JSON-serialisable: {exc}") from None

    @classmethod
    def from_bytes(cls, data: bytes) -> Checkpoint:
        try:
            doc = orjson.loads(data)
            fmt = doc.get("format")
            if fmt != _CHECKPOINT_FORMAT:
                raise StoreError(f"unsupported checkpoint format {fmt!r}")
            return cls(
                positions={(str(t), int(p)): int(o) for t, p, o in doc["positions"]},
                layout_epochs={str(t): int(e) for t, e in doc["layout_epochs"].items()},
                generation=int(doc["generation"]),
                ic_ranges={
                    (str(t), int(p)): [(int(a), int(b)) for a, b in ranges] for t, p, ranges in doc["ic_ranges"]
                },
                extra=dict(doc["extra"]),
            )
        except StoreError:
            raise
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as exc:
            from .serde import short_repr

            raise StoreError(f"corrupt checkpoint {short_repr(data)}: {exc}") from None


_EMPTY = Checkpoint()


class Store(ABC):
    """One processor's state: named tables of bytes -> bytes plus a checkpoint.

    Reads see the last commit.  ``commit`` is the only write and is atomic with
    respect to crashes: after a crash at any instant the store holds all of a
    commit (changes and checkpoint) or none of it.  Stores are not thread-safe;
    one thread (the processor loop) uses a store.
    """

    #: Human-readable name (defaults to the last path component).
    name: str
    #: Directory of the store, or None for an anonymous in-memory store.
    path: str | None

    @property
    @abstractmethod
    def tables(self) -> tuple[str, ...]:
        """The store's tables, sorted."""

    @property
    @abstractmethod
    def closed(self) -> bool: ...

    @abstractmethod
    def get(self, table: str, key: bytes) -> bytes | None:
        """The value of ``key`` in ``table``, or None."""

    def get_many(self, table: str, keys: Sequence[bytes]) -> list[bytes | None]:
        """Values of several keys, in the order given (None where absent)."""
        return [self.get(table, k) for k in keys]

    @abstractmethod
    def items(self, table: str, start: bytes | None = None, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs with ``start <= key < end`` in ascending byte order.

        The iteration sees the store as of the call (later commits are not visible).
        """

    @abstractmethod
    def commit(self, changes: Changes, checkpoint: Checkpoint) -> None:
        """Apply ``changes`` (value None = delete) and set ``checkpoint``, atomically.

        Unknown tables or non-bytes keys/values raise ``StoreError``/``TypeError``
        before anything is written.
        """

    @abstractmethod
    def checkpoint(self) -> Checkpoint:
        """The checkpoint of the last commit (``Checkpoint.empty()`` if none)."""

    @abstractmethod
    def close(self) -> None:
        """Release the store and its lock (idempotent).  Nothing is lost: each commit is durable when it returns."""

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<{type(self).__name__} {self.name!r} path={self.path!r} {state}>"


def check_changes(changes: Changes, tables: Mapping[str, Any] | Sequence[str] | set[str]) -> None:
    """Refuse a commit that names an unknown table (shared by the backends)."""
    for table in changes:
        if table not in tables:
            known = ", ".join(sorted(tables)) or "none"
            raise StoreError(f"unknown table {table!r} (tables: {known})")


def check_bytes(table: str, key: Any, value: Any) -> None:
    """Type check used by backends that do not check types themselves."""
    if type(key) is not bytes:
        raise TypeError(f"table {table!r}: keys must be bytes, got {type(key).__name__}")
    if value is not None and type(value) is not bytes:
        raise TypeError(f"table {table!r}: values must be bytes or None, got {type(value).__name__}")
