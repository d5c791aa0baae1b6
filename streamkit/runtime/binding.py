"""Which processor's state the app's tables read and write while user code runs.

Tables are declared on the App and used by name in handlers (`totals[key] += 1`), so
the declaration objects themselves must be pointed at one processor's state while its
records, callbacks or timers run. The runtime owns that pointing: a `TableBinder` per
group member (and per timer) binds every table to a processor's write-back caches and
to the clock that windowed tables read (the member's context: the record being
handled). Nothing else binds tables; the App is never written to.
"""

from __future__ import annotations

from collections.abc import Mapping

from streamkit.tables import Table, TableBackend
from streamkit.windows.table import CurrentTime


class TableBinder:
    """Binds the declared `tables` to one processor's backends at a time."""

    __slots__ = ("_clock", "_tables")

    def __init__(self, tables: Mapping[str, Table], clock: CurrentTime) -> None:
        self._tables = tables
        self._clock = clock

    def bind(self, backends: Mapping[str, TableBackend]) -> None:
        """Point each table at its backend in `backends` (a processor's caches)."""
        clock = self._clock
        for name, backend in backends.items():
            self._tables[name].bind(backend, clock)

    def unbind(self, names: Mapping[str, object] | None = None) -> None:
        """Leave the tables (or those named) unbound: using them raises a clear error."""
        for name in self._tables if names is None else names:
            self._tables[name].bind(None)
