"""Windowed tables as handlers use them.

``t[key]`` addresses the window of the record being handled (its Kafka timestamp), as
faust's ``.current()`` does: the tumbling window that holds it, or the session it
created, extended or merged. A record joins several hopping windows and several count
windows, so those tables are updated with ``t.update(key, fn)`` (``fn`` applied to
every window that holds the record), which every kind has. ``t.windows(key)`` lists a
key's windows.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Protocol

from stores.serde import Serde, serde_for
from streamkit.tables import Table, TableBackend
from streamkit.windows import sliding
from streamkit.windows.kinds import Count, Hopping, Session, Sliding, Tumbling, Window, WindowKind, window_closed
from streamkit.windows.late import MissedWindows
from streamkit.windows.state import WindowState

_MISSING: Any = object()


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


def _kind_name(kind: WindowKind) -> str:
    return type(kind).__name__.lower()


class BookTable(Table):
    """The hidden table beside a windowed table that books its windows (``state``)."""

    def __init__(self, table: WindowedTable) -> None:
        super().__init__(table.book_name, table.key_serde, serde_for("json"))
        self.window = table.window
        self._stored_key_serde = WindowKeySerde(table.key_serde)

    @property
    def store_key_serde(self) -> Serde:
        return self._stored_key_serde


class WindowedTable(Table):
    """A table whose keys are (key, window start): see the module's docstring."""

    def __init__(
        self,
        name: str,
        key_serde: Serde,
        value_serde: Serde,
        window: WindowKind,
        default: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(name, key_serde, value_serde, default)
        self.window = window
        self.closes = False
        """A close callback is declared (``App.on_window_close``): the table keeps a book."""
        self._clock: Any = _NoClock(name)
        self._state: WindowState | None = None
        self._stored_key_serde = WindowKeySerde(key_serde)
        self._fast = type(window) is Tumbling  # one window per record, located by arithmetic
        self.missed = MissedWindows(name)
        """The records that came too late for some of their windows while joining others
        (hopping, sliding), and the windows they missed, since the process started
        (``streamkit.windows.late``): every processor's of this table."""

    @property
    def book_name(self) -> str:
        return f"{self.name}__windows"

    @property
    def needs_book(self) -> bool:
        return self.closes or isinstance(self.window, Session | Sliding | Count)

    def state_over(self, data: TableBackend, book: TableBackend | None, index: bool = True) -> WindowState:
        """This table's window state over one processor's backends (``book``: the book's;
        ``index=False``: no close index, for the replay)."""
        return WindowState(self.name, self.window, data, book if self.needs_book else None, index, self.missed)

    def bind(self, backend: TableBackend | None, clock: Any = None) -> None:
        """Bind to a processor's ``WindowState`` (None: unbound): entries are read and
        written in its ``data`` directly, windows placed by it."""
        if backend is not None and not isinstance(backend, WindowState):
            raise TypeError(f"windowed table {self.name!r} must be bound to its WindowState, got {backend!r}")
        self._state = backend
        super().bind(backend.data if backend is not None else None, clock)
        self._clock = clock if clock is not None and backend is not None else _NoClock(self.name)

    @property
    def store_key_serde(self) -> Serde:
        return self._stored_key_serde

    def _bound(self) -> WindowState:
        if self._state is None:
            self._backend.get(None)  # the unbound backend's error
        assert self._state is not None
        return self._state

    def _place(self, key: Any) -> list[Window]:
        clock = self._clock
        state = self._bound()
        state.replaying = getattr(clock, "replaying", False)
        return state.place(key, clock.timestamp, getattr(clock, "stream_time", -1), getattr(clock, "record", None))

    def _wkey(self, key: Any) -> tuple[Any, int]:
        if self._fast and not self.closes:
            clock = self._clock
            ts = clock.timestamp
            window: Tumbling = self.window
            start = ts - ts % window.size_ms
            stream_time = getattr(clock, "stream_time", -1)
            if stream_time >= 0 and window.closed(start, stream_time):
                raise window_closed(self.name, window, start, stream_time)
            return (key, start)
        if isinstance(self.window, Hopping | Count):
            raise TypeError(
                f"table {self.name!r} has {_kind_name(self.window)} windows: a record joins several of them; "
                f"update them with {self.name}.update(key, fn)"
            )
        return (key, self._place(key)[-1].start)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(self.window, Sliding):
            value = self._current(key, _MISSING)
            if value is _MISSING:
                if self.default is None:
                    raise KeyError(key)
                return self.default()
            return value
        return super().__getitem__(self._wkey(key))

    def get(self, key: Any, default: Any = None) -> Any:
        if isinstance(self.window, Sliding):
            return self._current(key, default)
        return self._backend.get(self._wkey(key), default)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._backend[self._wkey(key)] = self._no_sliding_write(value)

    def __delitem__(self, key: Any) -> None:
        self._no_sliding_write(None)
        self._backend.__delitem__(self._wkey(key))

    def __contains__(self, key: object) -> bool:
        if isinstance(self.window, Sliding):
            return self._current(key, _MISSING) is not _MISSING
        return self._wkey(key) in self._backend

    def _no_sliding_write(self, value: Any) -> Any:
        if isinstance(self.window, Sliding):
            raise TypeError(
                f"table {self.name!r} has sliding windows: their values come from their records; "
                f"add the record's value with {self.name}.add(key, value)"
            )
        return value

    def _current(self, key: Any, default: Any) -> Any:
        """A sliding table's value in the window ending with the record being handled (or,
        when that one has closed, the first open window holding it)."""
        window: Sliding = self.window
        clock = self._clock
        first = sliding.first_open(window, clock.timestamp, getattr(clock, "stream_time", -1))
        start = first if first <= clock.timestamp else clock.timestamp - window.size_ms
        return self._bound().value_of(key, Window(start, start + window.size_ms), default)

    def add(self, key: Any, value: Any) -> Window:
        """Add the record's ``value`` to ``key``'s sliding windows (each window's value is
        ``reduce`` over the values its records added); returns the window ending with the
        record. Sliding windows only: the others are updated with :meth:`update`."""
        if not isinstance(self.window, Sliding):
            raise TypeError(
                f"table {self.name!r} has {_kind_name(self.window)} windows: update them with "
                f"{self.name}.update(key, fn) (add is for sliding windows)"
            )
        clock = self._clock
        stream_time, record = getattr(clock, "stream_time", -1), getattr(clock, "record", None)
        state = self._bound()
        state.replaying = getattr(clock, "replaying", False)
        placed = state.place_sliding(key, clock.timestamp, stream_time, self.window, record)
        backend = self._backend
        k = (key, placed.slot)  # one entry per slot: the values added there, reduced
        old = backend.get(k, _MISSING)
        backend[k] = value if old is _MISSING else self.window.reduce(old, value)
        return placed.window

    def update(self, key: Any, fn: Callable[[Any], Any]) -> list[Window]:  # type: ignore[override]
        """Apply ``fn(value) -> new value`` to every window of ``key`` that the record being
        handled joins (a missing window starts from the table's ``default()``, else None);
        returns those windows. The way to update hopping and count windows; works for every
        kind but sliding windows, whose values come from :meth:`add` (a count window table
        counts the record once, however often it is called)."""
        self._no_sliding_write(None)
        backend = self._backend
        default = self.default
        windows = self._place(key)
        for w in windows:
            k = (key, w.start)
            value = backend.get(k, _MISSING)
            if value is _MISSING:
                value = default() if default is not None else None
            backend[k] = fn(value)
        return windows

    def windows(self, key: Any) -> list[tuple[Window, Any]]:
        """``key``'s windows held now (closed ones too, until they expire), oldest first, as
        (``Window(start, end)``, value)."""
        return self._bound().windows(key, self.key_serde.dumps(key))

    def get_window(self, key: Any, start_ms: int, default: Any = None) -> Any:
        """Value of `key` in the window starting at `start_ms`."""
        if isinstance(self.window, Sliding):
            window = Window(start_ms, start_ms + self.window.size_ms)
            return self._bound().value_of(key, window, default)
        return self._backend.get((key, start_ms), default)

    def put_window(self, key: Any, start_ms: int, value: Any) -> None:
        """Set ``key``'s value in the open time window starting at ``start_ms`` (one the
        key's records placed: a window nobody placed is not booked, so never closes)."""
        if type(self.window) is not Tumbling:
            raise TypeError(
                f"table {self.name!r} has {_kind_name(self.window)} windows: put_window is for tumbling ones"
            )
        self._backend[(key, start_ms)] = value

    def window_start(self, timestamp_ms: int) -> int:
        """The start of the (newest) time window holding ``timestamp_ms``."""
        if not isinstance(self.window, Tumbling):
            raise TypeError(f"table {self.name!r} has {_kind_name(self.window)} windows: no fixed start per time")
        return self.window.start_of(timestamp_ms)
