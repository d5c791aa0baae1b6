"""One processor's side of one windowed table: where records go, expiry and reads.

A table needs a book when it has sessions or count windows (to find them), or a close
callback (to know which windows have not closed); a tumbling or hopping table without
one has none and costs nothing more than its windows.

The book and the close index are :class:`streamkit.windows.book.WindowBook`'s (see
there): whether a window has closed is part of the state.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from streamkit.tables import TableBackend as Backend
from streamkit.windows import sliding
from streamkit.windows.book import BOOK_SLOT, ENDED, FULL, OPEN, WindowBook
from streamkit.windows.kinds import (
    Count,
    LateRecordError,
    Session,
    Sliding,
    Tumbling,
    Window,
    WindowKind,
    window_closed,
)
from streamkit.windows.late import MissedWindows

__all__ = ["BOOK_SLOT", "ENDED", "FULL", "OPEN", "WindowState"]


class WindowState(WindowBook):
    """What a windowed table is bound to while one processor runs: its entries (the
    table protocol, delegated to ``data``), and where records go and windows close."""

    __slots__ = ("missed", "replaying", "_missed_by")

    def __init__(
        self,
        name: str,
        kind: WindowKind,
        data: Backend,
        book: Backend | None,
        index: bool = True,
        missed: MissedWindows | None = None,
    ) -> None:
        """``missed``: where the table counts the windows records came too late for while
        joining others (its own, shared by its processors: ``WindowedTable.missed``)."""
        self.missed = missed if missed is not None else MissedWindows(name)
        self.replaying = False
        """Whether the record being placed is handled again (a rebuild, a replay)."""
        self._missed_by: dict[tuple[int, Any], Any] = {}
        """(id(record), key) -> record whose missed windows were counted this batch."""
        super().__init__(name, kind, data, book, index)

    def forget_records(self) -> None:
        super().forget_records()
        if self._missed_by:
            self._missed_by.clear()

    # -- where a record goes ----------------------------------------------------------------
    def place(self, key: Any, timestamp: int, stream_time: int, record: Any = None) -> list[Window]:
        """The open windows of ``key`` that a record of ``timestamp`` joins (a session: the
        one it created, extended or merged; a count window table: counting the record),
        booked if the table keeps a book. Raises ``LateRecordError`` if it joins none; the
        closed windows of one that joins some are counted in ``missed`` and said
        (``streamkit.windows.late``)."""
        kind = self.kind
        if isinstance(kind, Tumbling):
            return self._place_time(key, timestamp, stream_time, kind, record)
        if isinstance(kind, Session):
            return [self._place_session(key, timestamp, stream_time, kind)]
        if isinstance(kind, Sliding):
            return [self.place_sliding(key, timestamp, stream_time, kind, record).window]
        return self._place_count(key, record, kind)

    def _place_time(
        self, key: Any, timestamp: int, stream_time: int, kind: Tumbling, record: Any = None
    ) -> list[Window]:
        size = kind.size_ms
        if kind.advance_ms == size:  # tumbling: one window, by arithmetic
            start = timestamp - timestamp % size
            windows = [Window(start, start + size)]
        else:
            windows = kind.windows_of(timestamp)
        if stream_time >= 0:
            grace = kind.grace_ms
            if windows[0].end + grace <= stream_time:  # (the oldest closes first)
                held = len(windows)
                windows = [w for w in windows if w.end + grace > stream_time]
                if not windows:
                    raise window_closed(self.name, kind, kind.start_of(timestamp), stream_time)
                self._count_missed(key, record, held - len(windows), len(windows), timestamp, stream_time, kind.grace)
        if self.book is not None:
            known = self._known
            for w in windows:
                if (key, w.start) not in known:
                    known.add((key, w.start))
                    entry = self.book.get((key, BOOK_SLOT)) or {"w": []}
                    self._write_book(key, entry, [*entry["w"], [w.start, w.end, OPEN]])
                    self._push(key, w)
        return windows

    def _place_session(self, key: Any, timestamp: int, stream_time: int, kind: Session) -> Window:
        assert self.book is not None
        entry = self.book.get((key, BOOK_SLOT)) or {"w": []}
        sessions = entry["w"]
        near = [  # (a session past its retention is gone, whether a checkpoint deleted it yet or
            s  # not, and whether its close has fired yet or not: that waits for the batch's end)
            for s in sessions
            if kind.joins(Window(s[0], s[1]), timestamp)
            and not 0 <= kind.expiry_time(Window(s[0], s[1])) <= stream_time
        ]
        joined = [
            s for s in near if s[2] == OPEN and (stream_time < 0 or kind.close_time(Window(s[0], s[1])) > stream_time)
        ]
        if len(joined) == 1 and joined[0][0] <= timestamp <= joined[0][1]:
            return Window(joined[0][0], joined[0][1])  # inside one session: nothing changes
        closed_near = len(joined) < len(near)  # a closed session is final: a record it would take is late
        if closed_near or (
            not joined and stream_time >= 0 and kind.close_time(Window(timestamp, timestamp)) <= stream_time
        ):
            raise LateRecordError(
                f"table {self.name!r}: a session of the record's time ({timestamp} ms) closed (stream time "
                f"{stream_time} ms, gap {kind.gap:g} s, grace {kind.grace:g} s): the record is late",
                self.name, timestamp, timestamp, stream_time,
            )  # fmt: skip
        joined.sort()
        start = min([timestamp, *(s[0] for s in joined)])
        end = max([timestamp, *(s[1] for s in joined)])
        merged: Any = _NONE
        for s in joined:  # every value merged before any is deleted (a merge may raise)
            value = self.data.get((key, s[0]), _NONE)
            if value is not _NONE:
                merged = value if merged is _NONE else kind.merge(merged, value)
        for s in joined:
            if s[0] != start and (key, s[0]) in self.data:
                del self.data[(key, s[0])]
        if merged is not _NONE:
            self.data[(key, start)] = merged
        rest = [s for s in sessions if s not in joined]
        self._write_book(key, entry, sorted([*rest, [start, end, OPEN]]))
        window = Window(start, end)
        if all(s[0] != start for s in joined):  # a session with this start has its entry (re-pushed when due)
            self._push(key, window)
        return window

    def place_sliding(
        self, key: Any, timestamp: int, stream_time: int, kind: Sliding, record: Any = None
    ) -> sliding.Placed:
        """The first window the record joins (the one ending with it, when that is open)
        and the slot of its value; its time joins the key's (booked). It joins every window
        holding it that is still open, so it is late only when all have closed
        (``streamkit.windows.sliding``); the ones closed before it are counted in
        ``missed`` and said."""
        first = sliding.first_open(kind, timestamp, stream_time)
        if first > timestamp:
            raise LateRecordError(
                f"table {self.name!r}: every sliding window that could hold the record ({timestamp} ms) closed "
                f"(stream time {stream_time} ms, grace {kind.grace:g} s): the record is late",
                self.name, timestamp, timestamp + kind.size_ms, stream_time,
            )  # fmt: skip
        assert self.book is not None
        entry, placed, new = sliding.add_record(kind, self.book.get((key, BOOK_SLOT)), timestamp, first)
        if first > timestamp - kind.size_ms:  # the window ending with it closed: it joined the later ones only
            missed, joined = sliding.missed_and_joined(kind, entry, timestamp, first)
            self._count_missed(key, record, missed, joined, timestamp, stream_time, kind.grace)
        if new:
            self.book[(key, BOOK_SLOT)] = entry
            if placed.slot == timestamp:
                self._push(key, placed.window)
            self._push(key, kind.right(timestamp))
        return placed

    def _count_missed(
        self, key: Any, record: Any, missed: int, joined: int, timestamp: int, stream_time: int, grace: float
    ) -> None:
        """Count (and say) the closed windows a record joined none of: once per record and
        key, however often a handler places it (``record`` None: every time), and not when
        it is handled again (``replaying``: it was counted when first handled)."""
        if self.replaying:
            return
        if record is not None:
            if self._missed_by.get((id(record), key)) is record:
                return
            self._missed_by[(id(record), key)] = record
        self.missed.count(missed, joined, timestamp, stream_time, grace, record)

    def value_of(self, key: Any, window: Window, default: Any = None) -> Any:
        """``window``'s value: its entry, or for a sliding window the ``reduce`` of the values
        its records added, in time order (``default`` when it holds none)."""
        kind = self.kind
        if not isinstance(kind, Sliding):
            return self.data.get((key, window.start), default)
        entry = self.book.get((key, BOOK_SLOT)) if self.book is not None else None
        if not entry:
            return default
        value: Any = _NONE
        for slot in sliding.slots_in(entry, window):
            v = self.data.get((key, slot), _NONE)
            if v is not _NONE:
                value = v if value is _NONE else kind.reduce(value, v)
        return default if value is _NONE else value

    def _place_count(self, key: Any, record: Any, kind: Count) -> list[Window]:
        if record is not None and (seen := self._counted.get((id(record), key))) is not None and seen[0] is record:
            return seen[1]
        assert self.book is not None
        entry = self.book.get((key, BOOK_SLOT)) or {"w": [], "n": 0}
        index = entry.get("n", 0)
        windows = kind.windows_of(index)
        book = [w for w in entry["w"]]
        for w in windows:
            if w.start == index:
                book.append([w.start, w.end, OPEN])
        for w in book:
            if w[1] == index + 1:  # its n-th record: full, closes at the next close check
                w[2] = FULL
                self._push(key, Window(w[0], w[1]), due=-1)
        self._write_book(key, {"n": index + 1}, book)
        if record is not None:
            self._counted[(id(record), key)] = (record, windows)
        return windows

    # -- expiry ---------------------------------------------------------------------------------
    def expire(self, stream_time: int) -> int:
        """Delete the windows past their retention (at a checkpoint; through the caches, so
        part of its batch). Scans only when stream time entered a new period since the last
        scan. Returns how many were deleted."""
        kind = self.kind
        if stream_time < 0 or isinstance(kind, Count):
            return 0
        if isinstance(kind, Sliding):
            return self._expire_sliding(stream_time, kind)
        period = kind.advance_ms if isinstance(kind, Tumbling) else kind.gap_ms
        mark = stream_time // period
        if mark == self._expiry_mark:
            return 0
        self._expiry_mark = mark
        if isinstance(kind, Tumbling):
            retention = kind.size_ms + kind.retention_ms
            gone = [k for k in _keys(self.data) if k[1] + retention <= stream_time]
            for k in gone:
                del self.data[k]
            return len(gone)
        assert self.book is not None
        deleted = 0
        for (key, _), entry in list(self.book.items()):
            kept = []
            for s in entry["w"]:
                if s[2] == ENDED and kind.expiry_time(Window(s[0], s[1])) <= stream_time:
                    if (key, s[0]) in self.data:
                        del self.data[(key, s[0])]
                    deleted += 1
                else:
                    kept.append(s)
            if len(kept) != len(entry["w"]):
                self._write_book(key, entry, kept)
        return deleted

    def _expire_sliding(self, stream_time: int, kind: Sliding) -> int:
        """Delete the records whose every window is past its retention and closed (the
        book's ``x``: the last time deleted; windows starting there or before are gone)."""
        mark = stream_time // kind.size_ms
        if mark == self._expiry_mark:
            return 0
        self._expiry_mark = mark
        assert self.book is not None
        deleted = 0
        for (key, _), entry in list(self.book.items()):
            left, slots = sliding.delete_through(kind, entry, stream_time)
            if not slots:
                continue
            for slot in slots:
                if (key, slot) in self.data:
                    del self.data[(key, slot)]
            deleted += len(slots)
            if left is None:
                del self.book[(key, BOOK_SLOT)]
            else:
                self.book[(key, BOOK_SLOT)] = left
        return deleted

    # -- reads ------------------------------------------------------------------------------------
    def held(self) -> Iterator[tuple[Any, Window, Any]]:
        """Every key's windows held now, as (key, window, value): what :meth:`windows` gives
        per key, for all keys (tests and tools)."""
        if isinstance(self.kind, Sliding):
            assert self.book is not None
            for (key, _), _entry in list(self.book.items()):
                for window, value in self.windows(key):
                    yield key, window, value
            return
        keys = sorted({k for k, _ in _keys(self.data)}, key=repr)
        for key in keys:
            for window, value in self.windows(key):
                yield key, window, value

    def windows(self, key: Any, key_bytes: bytes | None = None) -> list[tuple[Window, Any]]:
        """``key``'s windows held now (closed ones too, until they expire), oldest first."""
        kind = self.kind
        if isinstance(kind, Sliding):
            entry = self.book.get((key, BOOK_SLOT)) if self.book is not None else None
            if not entry:
                return []
            return [(w, self.value_of(key, w)) for w in sliding.windows_of(kind, entry)]
        ends: dict[int, int] = {}
        if isinstance(kind, Session):
            entry = self.book.get((key, BOOK_SLOT)) if self.book is not None else None
            ends = {s[0]: s[1] for s in entry["w"]} if entry else {}
        between = getattr(self.data, "items_between", None)
        if between is not None and key_bytes is not None:
            found = between(key_bytes + b"\x00" * 8, key_bytes + b"\xff" * 8)
        else:
            found = self.data.items()
        out = []
        for (k, start), value in found:
            if k != key:
                continue
            if isinstance(kind, Tumbling):
                out.append((Window(start, start + kind.size_ms), value))
            elif isinstance(kind, Count):
                out.append((Window(start, start + kind.n), value))
            else:
                out.append((Window(start, ends.get(start, start)), value))
        out.sort()
        return out


class _None:
    def __repr__(self) -> str:
        return "<none>"


_NONE: Any = _None()


def _keys(data: Backend) -> list[Any]:
    keys = getattr(data, "keys", None)
    return list(keys()) if keys is not None else [k for k, _ in data.items()]
