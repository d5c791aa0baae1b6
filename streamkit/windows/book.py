"""What one processor knows of one windowed table's windows: its book and its close index.

The windows are the table's entries, ``(key, start) -> value``. The **book** is a second
table beside it, ``(key, 0) -> {"w": [[start, end, state], ...], "n": count}``: per key,
the windows that have not closed yet (``OPEN``), the sessions that closed and are kept
until they expire (``ENDED``), the count windows that are full (``FULL``), and a count
window table's record count. The book is state like any other: checkpointed atomically
with the windows and the input positions, written to the changelog, moved with its keys
when processors scale (its keys end with 8 bytes, as the windows' do). So whether a
window has closed is part of the state: a restart, a restore or a rebuild reaches the
same closes, and a key that moves takes its open windows along.

The **close index** is memory only: a heap of (close time, key, start), rebuilt from the
book when the processor opens or rolls back, pushed to whenever the book gains an open
window or a session grows. Entries are checked against the book when they come due (a
session that grew since has a later entry; a rolled back one none).

:class:`WindowBook` holds both; :class:`streamkit.windows.state.WindowState` adds where
records go, expiry and reads.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from streamkit.tables import TableBackend as Backend
from streamkit.windows import sliding
from streamkit.windows.kinds import Count, Session, Sliding, Window, WindowKind

__all__ = ["BOOK_SLOT", "ENDED", "FULL", "OPEN", "WindowBook"]

OPEN, ENDED, FULL = 0, 1, 2
BOOK_SLOT = 0
"""The window start of every book entry's key: one entry per key."""


class WindowBook:
    """A windowed table's entries (the table protocol, delegated to ``data``), its book
    and its close index: which windows are open and when they close."""

    __slots__ = ("name", "kind", "data", "book", "_heap", "_seq", "_known", "_counted", "_expiry_mark")

    def __init__(self, name: str, kind: WindowKind, data: Backend, book: Backend | None, index: bool = True) -> None:
        """``index=False``: no close index (the offline replay, which sees one key at a
        time and closes nothing)."""
        self.name = name
        self.kind = kind
        self.data = data
        self.book = book
        self._heap: list[tuple[int, int, Any, int]] = []
        self._seq = itertools.count()
        self._known: set[tuple[Any, int]] = set()
        """(key, start) of the tumbling/hopping windows the book has open."""
        self._counted: dict[tuple[int, Any], tuple[Any, list[Window]]] = {}
        """(id(record), key) -> (record, windows) this batch: a count table counts each once."""
        self._expiry_mark = -1
        if index:
            self.reindex()

    # -- the table protocol ---------------------------------------------------------------
    def get(self, key: Any, default: Any = None) -> Any:
        return self.data.get(key, default)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.data[key] = value

    def __delitem__(self, key: Any) -> None:
        del self.data[key]

    def __contains__(self, key: Any) -> bool:
        return key in self.data

    def items(self) -> Iterator[tuple[Any, Any]]:
        return self.data.items()

    # -- the close index ---------------------------------------------------------------------
    def reindex(self) -> None:
        """Rebuild the close index from the book (at open, after a rollback)."""
        self._heap.clear()
        self._known.clear()
        self._counted.clear()
        if self.book is None:
            return
        kind = self.kind
        for (key, _), entry in self.book.items():
            if isinstance(kind, Sliding):
                closed = entry.get("c", -1)
                for w in sliding.candidates(kind, entry):
                    if kind.close_time(w) > closed:
                        self._push(key, w)
                continue
            for start, end, state in entry["w"]:
                if state == OPEN:
                    self._push(key, Window(start, end))
                    self._known.add((key, start))
                elif state == FULL:
                    self._push(key, Window(start, end), due=-1)

    def forget_records(self) -> None:
        """The batch is over: the records a count table counted are done with."""
        if self._counted:
            self._counted.clear()

    def _push(self, key: Any, window: Window, due: int | None = None) -> None:
        at = self.kind.close_time(window) if due is None else due
        heapq.heappush(self._heap, (at, next(self._seq), key, window.start))

    def next_close(self) -> int | None:
        """The earliest close time in the index (None: nothing to close)."""
        return self._heap[0][0] if self._heap else None

    def due(self, bound: int, accept: Callable[[Any], bool] | None = None) -> list[tuple[Any, Window]]:
        """The windows whose close time is at most ``bound``, in close-time order, as the
        book has them now (stale index entries are dropped); ``accept``: of the keys it
        accepts only (the others stay indexed)."""
        out: list[tuple[Any, Window]] = []
        heap, book = self._heap, self.book
        if book is None:
            return out
        if accept is not None:
            kept = [entry for entry in heap if entry[0] <= bound and not accept(entry[2])]
            heap[:] = [entry for entry in heap if entry[0] > bound or accept(entry[2])]
            heapq.heapify(heap)
            try:
                return self.due(bound)
            finally:
                for entry in kept:
                    heapq.heappush(heap, entry)
        slides = self.kind if isinstance(self.kind, Sliding) else None
        seen: set[tuple[Any, int]] = set()
        while heap and heap[0][0] <= bound:
            at, _, key, start = heapq.heappop(heap)
            entry = book.get((key, BOOK_SLOT))
            if entry is None:
                continue
            if slides is not None:  # due unless closed already, gone, or empty (a right window nothing joined)
                window = Window(start, start + slides.size_ms)
                if (
                    (key, start) not in seen
                    and slides.close_time(window) > entry.get("c", -1)
                    and sliding.held(entry, window)
                ):
                    seen.add((key, start))
                    out.append((key, window))
                continue
            for s, e, state in entry["w"]:
                if s != start:
                    continue
                window = Window(s, e)
                if state == FULL and at == -1:
                    out.append((key, window))
                elif state == OPEN:
                    close = self.kind.close_time(window)
                    if close <= at:
                        out.append((key, window))
                    elif isinstance(self.kind, Session):  # it grew since: due later
                        self._push(key, window)
                break
        return out

    def closed(self, key: Any, window: Window) -> None:
        """Record in the state that ``window`` of ``key`` closed (its callbacks ran): a
        session is kept until it expires, a count window is deleted, any other leaves the
        book (its entry stays until it expires)."""
        assert self.book is not None
        entry = self.book.get((key, BOOK_SLOT))
        if entry is None:
            return
        if isinstance(self.kind, Sliding):  # closes come in close-time order: one mark per key
            self.book[(key, BOOK_SLOT)] = {**entry, "c": max(entry.get("c", -1), self.kind.close_time(window))}
            return
        kept = []
        for w in entry["w"]:
            if w[0] == window.start:
                if isinstance(self.kind, Session):
                    kept.append([w[0], w[1], ENDED])
                elif isinstance(self.kind, Count) and (key, window.start) in self.data:
                    del self.data[(key, window.start)]
            else:
                kept.append(w)
        self._known.discard((key, window.start))
        self._write_book(key, entry, kept)

    def _write_book(self, key: Any, entry: dict[str, Any], windows: list[list[int]]) -> None:
        assert self.book is not None
        if not windows and not entry.get("n"):
            if (key, BOOK_SLOT) in self.book:
                del self.book[(key, BOOK_SLOT)]
            return
        new = {"w": windows}
        if "n" in entry:
            new["n"] = entry["n"]
        self.book[(key, BOOK_SLOT)] = new
