"""The kinds of windows, which windows a record joins, and when a window closes and expires.

Time is the processor's **stream time**: the largest record timestamp it has applied
(checkpointed with its state, so a restart decides exactly as the first run did; with
``close_on="wall"`` the wall clock moves it too). A window accepts records until stream
time reaches its close time (its end plus ``grace``); a record that joins no open
window is late (a dead letter with reason ``late``, or ``@app.on_late``). A record held
by several windows (hopping, sliding) that comes after some of them closed joins the
open ones only; the closed ones keep their value without it, and the windows it missed
are counted (``WindowedTable.missed``) and said in a warning (``streamkit.windows.late``).
A window is kept for reads until its end plus ``retention``, then deleted at a
checkpoint. All times are ms since the epoch; the settings are seconds.

The definitions follow Kafka Streams' where it has the kind: ``TimeWindows`` (tumbling,
hopping: ``[start, start + size)``, start a multiple of the advance), ``SessionWindows``
(an inactivity gap; a record that bridges two sessions merges them), ``SlidingWindows``
(windows defined by the records, both ends included). ``Count`` windows
are quixstreams' (a key's n records, optionally hopping by ``step`` records).
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from streamkit.checkpoint_keys import STREAM_TIME
from streamkit.errors import StreamkitError

DEFAULT_RETENTION = 24 * 3600.0
"""Seconds a window is kept after its end for reads (queries, ``table.windows(key)``): a day."""

DEFAULT_GRACE = 0.0
"""Seconds a window accepts records after its end, unless told: none, as quixstreams'
default and Kafka Streams' ``ofSizeWithNoGrace``. A window's final value then comes as soon
as a record of a later time arrives; input that comes out of time order needs a grace
(a record later than it is a dead letter with reason ``late``, or goes to ``@app.on_late``)."""

STREAM_TIME_KEY = STREAM_TIME
"""Where a store's checkpoint holds its processor's stream time (``streamkit.checkpoint_keys``)."""


NEVER = 1 << 62
"""A close time that stream time never reaches (count windows close on their n-th record)."""


class LateRecordError(StreamkitError):
    """A record for a window that has closed (stream time passed its end plus grace)."""

    def __init__(self, message: str, table: str = "", start: int = -1, end: int = -1, stream_time: int = -1) -> None:
        super().__init__(message)
        self.table, self.start, self.end, self.stream_time = table, start, end, stream_time


def window_closed(table: str, kind: Tumbling, start: int, stream_time: int) -> LateRecordError:
    """The error of a record whose time window (the one starting at ``start``) closed."""
    return LateRecordError(
        f"table {table!r}: the window starting at {start} ms closed (stream time {stream_time} ms, "
        f"grace {kind.grace:g} s): the record is late",
        table, start, start + kind.size_ms, stream_time,
    )  # fmt: skip


class Window(NamedTuple):
    """One window of a key: ``[start, end)`` in ms for time windows (a session's ``end``
    is its last record's time); for count windows, record numbers ``[start, end)``."""

    start: int
    end: int


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def _length_ms(seconds: float, what: str) -> int:
    """A window's length in ms, refused when the runtime cannot serve it: windows are
    placed in whole ms, so one shorter than 1 ms would be none (and NaN or infinity no
    length at all)."""
    if not math.isfinite(seconds) or _ms(seconds) < 1:
        raise ValueError(f"{what} must be at least 0.001 seconds (windows are placed in whole ms), got {seconds!r}")
    return _ms(seconds)


@dataclass(frozen=True)
class _TimeKind:
    """What every kind has: ``grace`` and ``retention`` (seconds)."""

    grace: float = DEFAULT_GRACE
    retention: float = DEFAULT_RETENTION

    def _check(self, name: str) -> None:
        """Refuse what cannot be served; then keep the settings in ms (read per record)."""
        if not (math.isfinite(self.grace) and self.grace >= 0):
            raise ValueError(f"{name} window grace must be >= 0 seconds, got {self.grace!r}")
        if not math.isfinite(self.retention):  # (a window kept for ever: state that grows without bound)
            raise ValueError(f"{name} window retention must be a finite number of seconds, got {self.retention!r}")
        if self.retention < self.grace:
            raise ValueError(
                f"{name} window retention ({self.retention!r} s) must be at least its grace ({self.grace!r} s): "
                "a window must be kept while it accepts records"
            )
        object.__setattr__(self, "grace_ms", _ms(self.grace))
        object.__setattr__(self, "retention_ms", _ms(self.retention))

    grace_ms: int = field(default=0, init=False, repr=False, compare=False)
    retention_ms: int = field(default=0, init=False, repr=False, compare=False)

    def close_time(self, window: Window) -> int:
        """When stream time closes ``window``: no record joins it from then on."""
        return window.end + self.grace_ms

    def expiry_time(self, window: Window) -> int:
        """When stream time expires ``window``: it is deleted from then on."""
        return window.end + self.retention_ms


@dataclass(frozen=True)
class Tumbling(_TimeKind):
    """Fixed, non-overlapping windows of ``size`` seconds aligned to the epoch; records
    are accepted ``grace`` seconds after a window's end, and the window is kept
    ``retention`` seconds after its end (at least ``grace``)."""

    size: float = 0.0

    def __init__(self, size: float, grace: float = DEFAULT_GRACE, retention: float = DEFAULT_RETENTION) -> None:
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "grace", grace)
        object.__setattr__(self, "retention", retention)
        if self.size <= 0:
            raise ValueError(f"Tumbling window size must be > 0 seconds, got {self.size!r}")
        self._check(type(self).__name__)
        object.__setattr__(self, "size_ms", _length_ms(self.size, f"{type(self).__name__} window size"))
        advance = getattr(self, "advance", 0.0) or self.size
        object.__setattr__(self, "advance_ms", _length_ms(advance, f"{type(self).__name__} window advance"))

    size_ms: int = field(default=0, init=False, repr=False, compare=False)
    advance_ms: int = field(default=0, init=False, repr=False, compare=False)

    def start_of(self, timestamp_ms: int) -> int:
        """Start (ms since the epoch) of the window holding `timestamp_ms`."""
        return timestamp_ms - timestamp_ms % self.size_ms

    def windows_of(self, timestamp_ms: int) -> list[Window]:
        """The windows a record of ``timestamp_ms`` joins, oldest first."""
        start = timestamp_ms - timestamp_ms % self.size_ms
        return [Window(start, start + self.size_ms)]

    def window_at(self, start_ms: int) -> Window:
        return Window(start_ms, start_ms + self.size_ms)

    def closed(self, start_ms: int, stream_time_ms: int) -> bool:
        """The window starting at ``start_ms`` accepts no more records."""
        return start_ms + self.size_ms + self.grace_ms <= stream_time_ms

    def expired(self, start_ms: int, stream_time_ms: int) -> bool:
        """The window starting at ``start_ms`` is past its retention: delete it."""
        return start_ms + self.size_ms + self.retention_ms <= stream_time_ms


@dataclass(frozen=True)
class Hopping(Tumbling):
    """Windows of ``size`` seconds starting every ``advance`` seconds (aligned to the
    epoch): a record joins every window ``[start, start + size)`` that holds its
    timestamp, ``size / advance`` of them when ``advance`` divides ``size``.
    ``Hopping(size, size)`` is ``Tumbling(size)``. A record that comes after the older of
    those windows closed (stream time past their end plus ``grace``) joins only the ones
    still open: the closed ones keep their value without it, and the windows it missed are
    counted in the table's ``missed`` and said in a warning line (at most one per table
    every few seconds, ``streamkit.windows.late``). It is late (a dead letter with reason
    ``late``, or ``@app.on_late``) only when all of them have closed."""

    advance: float = 0.0

    def __init__(
        self, size: float, advance: float, grace: float = DEFAULT_GRACE, retention: float = DEFAULT_RETENTION
    ) -> None:
        object.__setattr__(self, "advance", advance)
        if advance <= 0 or advance > size:
            raise ValueError(f"Hopping window advance must be > 0 and at most its size ({size!r} s), got {advance!r}")
        super().__init__(size, grace, retention)

    def windows_of(self, timestamp_ms: int) -> list[Window]:
        advance, size = self.advance_ms, self.size_ms
        start = timestamp_ms - timestamp_ms % advance
        out = []
        while start > timestamp_ms - size and start >= 0:
            out.append(Window(start, start + size))
            start -= advance
        out.reverse()
        return out

    def start_of(self, timestamp_ms: int) -> int:
        """The start of the newest window holding ``timestamp_ms``."""
        return timestamp_ms - timestamp_ms % self.advance_ms


@dataclass(frozen=True)
class Session(_TimeKind):
    """Per key, records at most ``gap`` seconds apart form one session ``[first, last]``;
    a record within ``gap`` of two sessions merges them, their values combined with
    ``merge(older, newer)`` (default ``+``). A session closes once stream time is more
    than ``gap + grace`` seconds past its last record (a record exactly ``gap`` after it
    still joins it, as in Kafka Streams), and is kept ``retention`` seconds after that
    close, at least ``gap``: until then a record within ``gap`` of it is late (a closed
    session is final), and one deleted sooner would let such a record open a session of
    its own, depending on when a checkpoint deleted it."""

    gap: float = 0.0
    merge: Callable[[Any, Any], Any] = field(default=operator.add, compare=False)

    def __init__(
        self,
        gap: float,
        grace: float = DEFAULT_GRACE,
        retention: float = DEFAULT_RETENTION,
        merge: Callable[[Any, Any], Any] = operator.add,
    ) -> None:
        object.__setattr__(self, "gap", gap)
        object.__setattr__(self, "grace", grace)
        object.__setattr__(self, "retention", retention)
        object.__setattr__(self, "merge", merge)
        if gap <= 0:
            raise ValueError(f"Session window gap must be > 0 seconds, got {gap!r}")
        if not callable(merge):
            raise TypeError(f"Session window merge must be a function (older, newer) -> merged, got {merge!r}")
        self._check("Session")
        object.__setattr__(self, "gap_ms", _length_ms(gap, "Session window gap"))

    gap_ms: int = field(default=0, init=False, repr=False, compare=False)

    def close_time(self, window: Window) -> int:
        return window.end + self.gap_ms + self.grace_ms + 1

    def expiry_time(self, window: Window) -> int:
        return self.close_time(window) + max(self.retention_ms, self.gap_ms)

    def joins(self, window: Window, timestamp_ms: int) -> bool:
        """A record of ``timestamp_ms`` belongs to (or extends) the session ``window``."""
        gap = self.gap_ms
        return window.start - gap <= timestamp_ms <= window.end + gap


@dataclass(frozen=True)
class Sliding(_TimeKind):
    """Kafka Streams' sliding windows (``SlidingWindows.ofTimeDifferenceAndGrace``): windows
    defined by the records themselves. Two records are in one window when their
    timestamps differ by at most ``size`` seconds. The windows of a key are, for each of
    its records at time t, the window ``[t - size, t]`` that ends with it and, when a
    later record lies within ``size`` of it, the window ``[t + 1, t + 1 + size]`` that
    starts right after it; both ends are included (``Window.end`` is the last
    millisecond a record may have). A window's value is ``reduce`` (default ``+``)
    over the values its records added (``table.add(key, value)``), in timestamp order,
    so ``reduce`` must be associative. A window closes ``grace`` seconds after its end.
    A record joins every window holding it that is still open when it comes, and the
    windows closed before it keep their value: a record whose own window has closed
    still counts in the later ones, and is late only when every window that could hold
    it has closed (Kafka Streams' rule; ``streamkit.windows.sliding``); the windows it
    missed are counted in the table's ``missed`` and said in a warning line
    (``streamkit.windows.late``). Records are kept
    ``retention`` seconds after the last window holding them ends."""

    size: float = 0.0
    reduce: Callable[[Any, Any], Any] = field(default=operator.add, compare=False)

    def __init__(
        self,
        size: float,
        grace: float = DEFAULT_GRACE,
        retention: float = DEFAULT_RETENTION,
        reduce: Callable[[Any, Any], Any] = operator.add,
    ) -> None:
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "grace", grace)
        object.__setattr__(self, "retention", retention)
        object.__setattr__(self, "reduce", reduce)
        if size <= 0:
            raise ValueError(f"Sliding window size must be > 0 seconds, got {size!r}")
        if not callable(reduce):
            raise TypeError(f"Sliding window reduce must be a function (older, newer) -> combined, got {reduce!r}")
        self._check("Sliding")
        object.__setattr__(self, "size_ms", _length_ms(size, "Sliding window size"))

    size_ms: int = field(default=0, init=False, repr=False, compare=False)

    def close_time(self, window: Window) -> int:
        return window.end + 1 + self.grace_ms

    def expiry_time(self, window: Window) -> int:
        return window.end + 1 + self.retention_ms

    def left(self, t: int) -> Window:
        """The window that ends with a record at ``t``."""
        return Window(t - self.size_ms, t)

    def right(self, t: int) -> Window:
        """The window that starts right after a record at ``t`` (it exists when it holds one)."""
        return Window(t + 1, t + 1 + self.size_ms)

    def last_end_holding(self, t: int, times: list[int]) -> int:
        """The latest end of a window that holds a record at ``t`` (``times``: the key's)."""
        size = self.size_ms
        i = bisect.bisect_right(times, t + size) - 1  # the last record whose window ending with it holds t
        end = times[i] if i >= 0 and times[i] >= t else t
        j = bisect.bisect_right(times, t - 1) - 1  # the last record before t: its right window holds t
        if j >= 0 and times[j] >= t - 1 - size:
            end = max(end, times[j] + 1 + size)
        return end


@dataclass(frozen=True)
class Count:
    """Windows of a key's ``n`` records: records ``[i * step, i * step + n)`` of the key
    (``step`` defaults to ``n``: tumbling by count; a smaller step makes them hop). A
    window closes with its n-th record and is deleted once closed (its close callback,
    if any, has its final value)."""

    n: int
    step: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"Count window n must be an integer >= 1, got {self.n!r}")
        if self.step == 0:
            object.__setattr__(self, "step", self.n)
        if not isinstance(self.step, int) or not 1 <= self.step <= self.n:
            raise ValueError(f"Count window step must be an integer from 1 to n ({self.n}), got {self.step!r}")

    def windows_of(self, index: int) -> list[Window]:
        """The windows the key's record number ``index`` (0, 1, ...) joins, oldest first."""
        n, step = self.n, self.step
        first = max(0, (index - n) // step + 1)
        return [Window(i * step, i * step + n) for i in range(first, index // step + 1)]

    def close_time(self, window: Window) -> int:
        return NEVER

    def expiry_time(self, window: Window) -> int:
        return NEVER


WindowKind = Tumbling | Session | Sliding | Count
"""Every kind a windowed table can have (``Hopping`` is a ``Tumbling``)."""
