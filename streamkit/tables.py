"""Tables: dict-like state declared on the app and used inside handlers.

A table object is shared by every processor of the worker; before calling a handler
the runtime binds it to the processor that owns the record's partition (a write-back
cache over that processor's store; `streamkit.runtime.binding`). So `totals[key] += 1` in a handler reads and
writes the right processor's state with a dict lookup, and the store sees the change
at the next checkpoint, atomically with the input positions that produced it.

Values are cached deserialised: mutate-in-place is NOT tracked. Assign the value back
(`row = t[k]; row["n"] += 1; t[k] = row`) for the change to be saved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, Protocol

from mypy_extensions import mypyc_attr

from stores.serde import Serde

_MISSING: Any = object()


_NOTHING_CACHED: dict[Any, Any] = {}
"""The cache of a table bound to no cache. Never written: a table writes its ``_cached``
only while its ``_dirty`` is a cache's."""


class TableBackend(Protocol):
    """What a table is bound to: stores.cache.CachedTable, or the replay's guarded state."""

    def get(self, key: Any, default: Any = None) -> Any: ...
    def __setitem__(self, key: Any, value: Any) -> None: ...
    def __delitem__(self, key: Any) -> None: ...
    def __contains__(self, key: Any) -> bool: ...
    def items(self) -> Iterator[tuple[Any, Any]]: ...


@mypyc_attr(serializable=True)  # pickled with an unbound table
class _Unbound:
    """Stands in for a backend outside handlers, with an error that says so."""

    def __init__(self, name: str) -> None:
        self._name = name

    def _fail(self, *_: Any, **__: Any) -> Any:
        raise RuntimeError(
            f"table {self._name!r} was used outside a handler, timer or rebalance callback; "
            "its state belongs to a processor and is only reachable while one runs"
        )

    # methods of their own, not aliases of ``_fail``: the class is compiled (streamkit.compiled)
    def get(self, key: Any, default: Any = None) -> Any:
        return self._fail()

    def __setitem__(self, key: Any, value: Any) -> None:
        self._fail()

    def __delitem__(self, key: Any) -> None:
        self._fail()

    def __contains__(self, key: Any) -> bool:
        return bool(self._fail())

    def items(self) -> Iterator[tuple[Any, Any]]:
        return self._fail()


# compiled (streamkit.compiled): subclassed by windowed and fed tables, pickled with the app (Spark)
@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class Table(MutableMapping[Any, Any]):
    """A keyed table. `default` (a zero-argument callable, e.g. `int`) supplies missing values."""

    window: Any = None
    """A windowed table's kind of windows (``streamkit.windows``); None: not windowed."""

    def __init__(
        self, name: str, key_serde: Serde, value_serde: Serde, default: Callable[[], Any] | None = None
    ) -> None:
        if not name.isidentifier() and not name.replace("-", "_").isidentifier():
            raise ValueError(f"table name {name!r} must be letters, digits, '_' or '-'")
        self.name = name
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.default = default
        self._backend: TableBackend = _Unbound(name)
        self._cached: dict[Any, Any] = _NOTHING_CACHED
        """The bound backend's cache (``CachedTable.hot_path``), or nothing: every read asks ``_load``."""
        self._dirty: dict[Any, Any] | None = None
        """The bound cache's changes (None: writes go to the backend)."""
        self._load: Callable[[Any], Any] = self._read
        self._absent: Any = _MISSING
        """What ``_load`` gives for a key the backend lacks."""

    @property
    def store_key_serde(self) -> Serde:
        """The serde of the keys as stored (windowed tables add the window start)."""
        return self.key_serde

    def bind(self, backend: TableBackend | None, clock: Any = None) -> None:
        """Point the table at `backend` (None: unbound). Only the runtime's binder and the
        offline replay call this; `clock` is what windowed tables read the time from."""
        if backend is not None and backend is self._backend:
            return  # bound again to the same processor (a batch, a merge's run of records)
        self._backend = backend if backend is not None else _Unbound(self.name)
        hot = getattr(backend, "hot_path", None)
        if hot is not None:  # a write-back cache: its dicts read and written here
            self._cached, self._dirty, self._load, self._absent = hot()
        else:
            self._cached, self._dirty, self._load, self._absent = _NOTHING_CACHED, None, self._read, _MISSING

    def _read(self, key: Any) -> Any:
        return self._backend.get(key, _MISSING)

    # -- the hot path: no call over the cache's dicts (``CachedTable.hot_path``) --------
    def __getitem__(self, key: Any) -> Any:
        try:
            value = self._cached.get(key, _MISSING)
        except TypeError:  # unhashable: the cache's error, else the backend's (an unbound table's says so)
            if self._dirty is not None:
                raise
            value = _MISSING
        if value is _MISSING:
            value = self._load(key)
        if value is self._absent:
            if self.default is None:
                raise KeyError(key)
            return self.default()
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            value = self._cached.get(key, _MISSING)
        except TypeError:  # unhashable: the cache's error, else the backend's (an unbound table's says so)
            if self._dirty is not None:
                raise
            value = _MISSING
        if value is _MISSING:
            value = self._load(key)
        return default if value is self._absent else value

    def __setitem__(self, key: Any, value: Any) -> None:
        dirty = self._dirty
        if dirty is None:
            self._backend[key] = value
        else:
            self._cached[key] = dirty[key] = value

    def __delitem__(self, key: Any) -> None:
        self._backend.__delitem__(key)

    def __contains__(self, key: object) -> bool:
        return key in self._backend

    def __iter__(self) -> Iterator[Any]:
        return (k for k, _ in self._backend.items())

    def __len__(self) -> int:
        return sum(1 for _ in self._backend.items())

    def items(self) -> Iterator[tuple[Any, Any]]:  # type: ignore[override]
        return self._backend.items()

    def __repr__(self) -> str:
        return f"<Table {self.name}>"
