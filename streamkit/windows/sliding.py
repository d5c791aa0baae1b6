"""A sliding table's records of one key, as its book entry keeps them, and the windows they make.

Sliding windows are defined by their records, so the book keeps each key's record times
and the table keeps one value per slot (the ``reduce`` of the values added there):

- ``"t"``: the times of the records that came while the window ending with them was open
  (on time); each joined every window holding it, and its values are in slot ``t``;
- ``"l"``: ``[time, first, slot]`` of the records that came after the window ending with
  them had closed, though a later window holding them was still open (Kafka Streams'
  rule: a record is late only when every window that could hold it has closed). Such a
  record joined only the windows starting at ``first`` or later (those open when it
  came), so the windows closed before it keep their value; its values are in ``slot``,
  ``LATE_SLOTS`` plus the count of such records before it (``"k"``), apart from the
  values of the records on time;
- ``"c"``: the close time of the last window closed; ``"x"``: the last record time
  deleted (windows starting there or before are gone).

The windows of a key: the window ending with each record on time, and the window starting
right after each record when it holds a record that joined it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from streamkit.windows.kinds import Sliding, Window

NEVER_DELETED = -(1 << 62)
"""The book's ``x`` while it deleted no record."""

LATE_SLOTS = -(1 << 62)
"""Where the slots of a key's records that came after their own window closed begin: far
below any record time (a record may have none: -1)."""


class Placed(NamedTuple):
    """Where a record went: the first window it joined and the slot of its value."""

    window: Window
    slot: int


def first_open(kind: Sliding, timestamp: int, stream_time: int) -> int:
    """The start of the earliest window holding a record at ``timestamp`` that is open at
    ``stream_time`` (past ``timestamp``: every window that could hold it has closed)."""
    earliest = timestamp - kind.size_ms
    if stream_time < 0:
        return earliest
    return max(earliest, stream_time - kind.grace_ms - kind.size_ms)


def add_record(
    kind: Sliding, entry: Mapping[str, Any] | None, timestamp: int, first: int
) -> tuple[dict[str, Any], Placed, bool]:
    """The book entry with a record at ``timestamp`` that joins the windows starting at
    ``first`` or later; where it went; whether its time is new to the entry."""
    entry = dict(entry) if entry else {"t": []}
    if first <= timestamp - kind.size_ms:  # on time: it joins every window holding it
        times = entry["t"]
        i = bisect.bisect_left(times, timestamp)
        new = i == len(times) or times[i] != timestamp
        if new:
            entry["t"] = [*times[:i], timestamp, *times[i:]]
        return entry, Placed(kind.left(timestamp), timestamp), new
    late = entry.get("l", [])
    for t, f, slot in late:
        if t == timestamp and f == first:
            return entry, Placed(Window(first, first + kind.size_ms), slot), False
    slot = LATE_SLOTS + entry.get("k", 0)
    entry["k"] = entry.get("k", 0) + 1
    entry["l"] = sorted([*late, [timestamp, first, slot]])
    return entry, Placed(Window(first, first + kind.size_ms), slot), True


def missed_and_joined(kind: Sliding, entry: Mapping[str, Any], timestamp: int, first: int) -> tuple[int, int]:
    """Of the windows holding a record at ``timestamp`` that joined those starting at
    ``first`` or later (``entry``: with it added): how many it missed (the window ending
    with it and the key's others that closed before it, which keep their value) and how
    many it joined."""
    closed, joined = {kind.left(timestamp)}, 0
    for w in set(candidates(kind, entry)):
        if w.start <= timestamp <= w.end and held(entry, w):
            if w.start < first:
                closed.add(w)
            else:
                joined += 1
    return len(closed), joined


def _joined(window: Window, t: int, first: int) -> bool:
    """Whether a record at ``t`` that joined the windows starting at ``first`` on joined ``window``."""
    return window.start <= t <= window.end and first <= window.start


def slots_in(entry: Mapping[str, Any], window: Window) -> list[int]:
    """The slots of the records ``window`` holds, in time order (on time first at one time)."""
    times = entry["t"]
    found = [(t, 0, t) for t in times[bisect.bisect_left(times, window.start) : bisect.bisect_right(times, window.end)]]
    late = [(t, 1, slot) for t, f, slot in entry.get("l", ()) if _joined(window, t, f)]
    if late:
        found = sorted(found + late)
    return [slot for _, _, slot in found]


def holds(entry: Mapping[str, Any], window: Window) -> bool:
    """Whether a record joined ``window``."""
    times = entry["t"]
    i = bisect.bisect_left(times, window.start)
    if i < len(times) and times[i] <= window.end:
        return True
    return any(_joined(window, t, f) for t, f, _ in entry.get("l", ()))


def held(entry: Mapping[str, Any], window: Window) -> bool:
    """Whether ``window`` is one of the key's windows now: a record joined it and it is not
    gone (it starts after the last record time deleted)."""
    return window.start > entry.get("x", NEVER_DELETED) and holds(entry, window)


def record_times(entry: Mapping[str, Any]) -> list[int]:
    """Every record time of the entry, sorted and distinct."""
    late = entry.get("l")
    if not late:
        return list(entry["t"])
    return sorted({*entry["t"], *(t for t, _, _ in late)})


def candidates(kind: Sliding, entry: Mapping[str, Any]) -> Iterator[Window]:
    """The windows the entry's records may make (the close index holds these): the window
    ending with each record on time, the window starting right after every record."""
    for t in entry["t"]:
        yield kind.left(t)
        yield kind.right(t)
    for t, _, _ in entry.get("l", ()):
        yield kind.right(t)


def windows_of(kind: Sliding, entry: Mapping[str, Any]) -> list[Window]:
    """The key's windows held now, oldest first."""
    return sorted({w for w in candidates(kind, entry) if held(entry, w)})


def delete_through(
    kind: Sliding, entry: Mapping[str, Any], stream_time: int
) -> tuple[dict[str, Any] | None, list[int]]:
    """The entry without the records whose every window is past its retention and closed,
    and the slots deleted; None: no record is left. A record is kept at least size + grace
    past its last window: a record still on time then lies beyond ``size`` after it, so
    no window of a record to come reaches back to it."""
    keep = max(kind.retention_ms, kind.size_ms + kind.grace_ms)
    closed = entry.get("c", -1)
    times = record_times(entry)
    last_gone = None
    for t in times:
        last = kind.last_end_holding(t, times)
        if last + 1 + keep > stream_time or last + 1 + kind.grace_ms > closed:
            break
        last_gone = t
    if last_gone is None:
        return dict(entry), []
    on_time = [t for t in entry["t"] if t <= last_gone]
    late = [item for item in entry.get("l", ()) if item[0] <= last_gone]
    slots = on_time + [slot for _, _, slot in late]
    left = {**entry, "t": entry["t"][len(on_time) :], "x": last_gone}
    if "l" in entry:
        left["l"] = [item for item in entry["l"] if item[0] > last_gone]
        if not left["l"]:
            del left["l"]
    if not left["t"] and not left.get("l"):
        return None, slots
    return left, slots
