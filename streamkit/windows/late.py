"""Records late for some of their windows but not for all (hopping and sliding windows).

A record joins every open window that holds it: it is late (a dead letter with reason
``late``, or the table's ``@app.on_late`` callbacks) only when every window that could
hold it has closed. One that comes after some of them closed joins the others, and the
closed ones keep their value without it: it is no dead letter, so what it missed is said
here instead, as Kafka Streams counts each skipped window in its dropped-records metric
and logs "Skipping record for expired window". Each table counts the windows missed and
the records that missed them (:class:`MissedWindows`, ``WindowedTable.missed``), and says
so in one warning line naming the table, where the record lay and its timestamp, at most
every ``SAY_EVERY`` seconds per table: a stream of such records does not flood the log,
each line counts the ones not said since the last.
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["SAY_EVERY", "MissedWindows"]

SAY_EVERY = 10.0
"""Seconds between two warning lines of one table's records that missed windows."""


class MissedWindows:
    """One table's records that came too late for some of the windows holding them, since
    the process started: ``records`` of them, ``windows`` missed in all."""

    __slots__ = ("table", "records", "windows", "_said_at", "_unsaid")

    def __init__(self, table: str) -> None:
        self.table = table
        self.records = 0
        self.windows = 0
        self._said_at: float | None = None
        self._unsaid = 0
        """Records counted since the last line (not said on their own)."""

    def count(self, missed: int, joined: int, timestamp: int, stream_time: int, grace: float, record: Any) -> None:
        """A record at ``timestamp`` missed ``missed`` closed windows and joined ``joined``
        open ones (``record``: the one handled, for where it lay; None: unknown)."""
        self.records += 1
        self.windows += missed
        now = time.monotonic()
        if self._said_at is not None and now - self._said_at < SAY_EVERY:
            self._unsaid += 1
            return
        also = f"; {self._unsaid} more such record(s) since the last line" if self._unsaid else ""
        self._said_at, self._unsaid = now, 0
        log.warning(
            "table %r: a record of %s at %d ms came too late for %d of its windows (closed at stream time %d ms, "
            "grace %g s) and joined only the %d still open; the closed ones keep their value without it (%d "
            "window(s) missed by %d record(s) so far%s)",
            self.table, _where(record), timestamp, missed, stream_time, grace, joined, self.windows, self.records,
            also,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"MissedWindows({self.table!r}, records={self.records}, windows={self.windows})"


def _where(record: Any) -> str:
    """``topic[partition]@offset`` of the record handled (its key's partition), if known."""
    topic, partition = getattr(record, "topic", None), getattr(record, "partition", None)
    if topic is None or partition is None:
        return "an unknown partition"
    return f"{topic}[{partition}]@{getattr(record, 'offset', '?')}"
