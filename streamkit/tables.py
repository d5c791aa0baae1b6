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

import struct
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, Protocol

from stores.serde import Serde
from streamkit.windows import LateRecordError, Tumbling

_MISSING: Any = object()


class TableBackend(Protocol):
    """What a table is bound to: stores.cache.CachedTable, or the replay's guarded state."""

    def get(self, key: Any, default: Any = None) -> Any: ...
    def __setitem__(self, key: Any, value: Any) -> None: ...
    def __delitem__(self, key: Any) -> None: ...
    def __contains__(self, key: Any) -> bool: ...
    def items(self) -> Iterator[tuple[Any, Any]]: ...


class _Unbound:
    """Stands in for a backend outside handlers, with an error that says so."""

    def __init__(self, name: str) -> None:
        self._name = name

    def _fail(self, *_: Any, **__: Any) -> Any:
        raise RuntimeError(
            f"table {self._name!r} was used outside a handler, timer or rebalance callback; "
            "its state belongs to a processor and is only reachable while one runs"
        )

    get = __setitem__ = __delitem__ = __contains__ = items = _fail


class Table(MutableMapping[Any, Any]):
    """A keyed table. `default` (a zero-argument callable, e.g. `int`) supplies missing values."""

    window: Tumbling | None = None

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

    @property
    def store_key_serde(self) -> Serde:
        """The serde of the keys as stored (windowed tables add the window start)."""
        return self.key_serde

    def bind(self, backend: TableBackend | None, clock: CurrentTime | None = None) -> None:
        """Point the table at `backend` (None: unbound). Only the runtime's binder and the
        offline replay call this; `clock` is what windowed tables read the time from."""
        self._backend = backend if backend is not None else _Unbound(self.name)

    # -- the hot path: one extra call over the cache ------------------------------------
    def __getitem__(self, key: Any) -> Any:
        value = self._backend.get(key, _MISSING)
        if value is _MISSING:
            if self.default is None:
                raise KeyError(key)
            return self.default()
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        return self._backend.get(key, default)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._backend[key] = value

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


class WindowKeySerde:
    """Stored key of a windowed table: the user key's bytes + 8-byte big-endian window start."""

    def __init__(self, inner: Serde) -> None:
        self.inner = inner

    def dumps(self, key: tuple[Any, int]) -> bytes:
        return self.inner.dumps(key[0]) + struct.pack(">q", key[1])

    def loads(self, data: bytes) -> tuple[Any, int]:
        return self.inner.loads(data[:-8]), struct.unpack(">q", data[-8:])[0]


class CurrentTime(Protocol):
    @property
    def timestamp(self) -> int: ...


class _NoClock:
    """The clock of an unbound windowed table: no record, no time."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def timestamp(self) -> int:
        raise RuntimeError(f"windowed table {self._name!r} was used outside a handler or timer: no record time")


class WindowedTable(Table):
    """A table whose keys are (key, window start); `t[key]` addresses the window of the
    record being processed (its Kafka timestamp), as faust's `.current()` does."""

    def __init__(
        self,
        name: str,
        key_serde: Serde,
        value_serde: Serde,
        window: Tumbling,
        default: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(name, key_serde, value_serde, default)
        self.window = window
        self._clock: CurrentTime = _NoClock(name)
        self._stored_key_serde = WindowKeySerde(key_serde)

    def bind(self, backend: TableBackend | None, clock: CurrentTime | None = None) -> None:
        super().bind(backend, clock)
        self._clock = clock if clock is not None and backend is not None else _NoClock(self.name)

    @property
    def store_key_serde(self) -> Serde:
        return self._stored_key_serde

    def _wkey(self, key: Any) -> tuple[Any, int]:
        clock = self._clock
        ts = clock.timestamp
        window = self.window
        assert window is not None
        start = ts - ts % window.size_ms
        stream_time = getattr(clock, "stream_time", -1)
        if stream_time >= 0 and window.closed(start, stream_time):
            raise LateRecordError(
                f"table {self.name!r}: the window starting at {start} ms closed (stream time {stream_time} ms, "
                f"grace {window.grace:g} s): the record is late"
            )
        return (key, start)

    def __getitem__(self, key: Any) -> Any:
        return super().__getitem__(self._wkey(key))

    def get(self, key: Any, default: Any = None) -> Any:
        return self._backend.get(self._wkey(key), default)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._backend[self._wkey(key)] = value

    def __delitem__(self, key: Any) -> None:
        self._backend.__delitem__(self._wkey(key))

    def __contains__(self, key: object) -> bool:
        return self._wkey(key) in self._backend

    def get_window(self, key: Any, start_ms: int, default: Any = None) -> Any:
        """Value of `key` in the window starting at `start_ms`."""
        return self._backend.get((key, start_ms), default)

    def window_start(self, timestamp_ms: int) -> int:
        return self.window.start_of(timestamp_ms)  # type: ignore[union-attr]
