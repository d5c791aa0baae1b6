"""A standby copy of a processor's store, kept current by tailing its changelog partition.

A standby reads processor ``pid``'s partition (``streamkit.state.changelog``) from its
own changelog position on and applies what a restore of the newest chain would, one
batch at a time, as their markers close them:

1. A change record waits, by batch, until a marker names its batch.
2. A marker of an older generation than the last one applied is a zombie's: its batch
   is dropped.
3. A marker whose base is the copy's position continues the copy's lineage: its batch's
   records are applied, with the marker's checkpoint and the position after it, in one
   store batch (a kill at any instant leaves the copy at one marker or the next).
4. A snapshot marker (no base) replaces the whole state with its batch.
5. Any other marker (it builds on a position the copy is not at: a new owner whose
   store was behind the copy, a marker the copy never saw) breaks the lineage:
   :class:`LineageBroken`, and the keeper restores the copy from the whole partition.

Nothing else is applied: a batch its marker never closed (a crash between the two
writes) is dropped at the next marker. The copy never reads the input, sends nothing and
runs no timer; promoted, it is an ordinary store at the last marker it applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from stores.base import Checkpoint
from stores.rocksdb import RocksDBStore
from streamkit.state.changelog import CHANGELOG_POSITION, MARKER_PREFIXES, Marker, position_of
from streamkit.state.restore import INCARNATION_KEY

__all__ = ["LineageBroken", "NotInChangelog", "StandbyCopy"]


class LineageBroken(Exception):
    """The changelog goes on from a position the copy is not at: restore it whole."""


class NotInChangelog(Exception):
    """The store has no changelog position (a job from before changelogs, a backfill, a
    store written past the changelog): it is nobody's copy, and never deleted as one."""


class StandbyCopy:
    """Processor ``pid``'s store as a standby: :meth:`apply` the partition's records read
    from :attr:`position` on, in offset order."""

    def __init__(self, pid: int, store: RocksDBStore, tables: Sequence[str], incarnation: str = "") -> None:
        self.pid = pid
        self.store = store
        self.tables = list(tables)
        self.incarnation = incarnation
        cp = store.checkpoint()
        position = position_of(cp)
        if position is None:
            raise NotInChangelog(f"processor {pid}'s store at {store.path} has no changelog position")
        self.position = position
        """The changelog position after the last marker applied (what the store records)."""
        self.generation = cp.generation
        self.read_to = position
        """The offset after the last record seen (applied or waiting)."""
        self.applied = 0
        """Batches applied since the copy was opened."""
        self._waiting: list[Any] = []
        """The records read since the last marker applied: which batch each is of, its
        marker says (a zombie's, or one no marker closes, are among them)."""

    @classmethod
    def open(
        cls, pid: int, path: Path, tables: Sequence[str], incarnation: str = "", configure: Any = None
    ) -> StandbyCopy:
        store = RocksDBStore.open(str(path), sorted(tables), create=False, configure=configure)
        try:
            return cls(pid, store, tables, incarnation)
        except BaseException:
            store.close()
            raise

    def apply(self, records: Iterable[Any]) -> int:
        """Apply ``records`` (each with ``offset``, ``key``, ``value``, ``headers``; those
        below :attr:`read_to` are skipped); the batches applied."""
        applied = 0
        for r in records:
            if r.offset < self.read_to:
                continue
            self.read_to = r.offset + 1
            key = r.key
            if key is None:
                continue
            if key.startswith(MARKER_PREFIXES):
                if (marker := Marker.of(r)) is not None:  # (one streamkit did not write: skipped and said)
                    applied += self._on_marker(r.offset, marker)
                continue
            self._waiting.append(r)
        self.applied += applied
        return applied

    def _on_marker(self, offset: int, marker: Marker) -> int:
        theirs = str(marker.checkpoint.extra.get(INCARNATION_KEY, ""))
        if self.incarnation and theirs and theirs != self.incarnation:
            return 0  # a marker of the job before a reset
        if marker.generation < self.generation:
            self._waiting = marker.split(self._waiting)[1]
            return 0  # a zombie's
        if marker.base is not None and marker.base != self.position:
            raise LineageBroken(
                f"processor {self.pid}: the marker at {offset} builds on changelog position {marker.base}, "
                f"the standby is at {self.position}"
            )
        records = marker.split(self._waiting)[0]
        self._waiting = []  # batches no marker closed before this one never will
        changes: dict[str, dict[bytes, bytes | None]] = {t: {} for t in self.tables}
        for r in records:  # (a batch's records all lie before its marker: sent once acknowledged)
            table, _, stored = r.key.partition(b"\x00")
            name = table.decode()
            if name in changes:
                changes[name][stored] = r.value
        if marker.base is None:  # a snapshot: the whole state
            changes = self._replacing(changes)
        checkpoint = marker.checkpoint.replace(extra={**marker.checkpoint.extra, CHANGELOG_POSITION: offset + 1})
        self.store.commit(changes, checkpoint)
        self.position, self.generation = offset + 1, marker.generation
        return 1

    def _replacing(self, snapshot: dict[str, dict[bytes, bytes | None]]) -> dict[str, dict[bytes, bytes | None]]:
        """A store batch that leaves exactly ``snapshot`` in the store."""
        out: dict[str, dict[bytes, bytes | None]] = {}
        for table in self.tables:
            new = {k: v for k, v in snapshot.get(table, {}).items() if v is not None}
            gone: dict[bytes, bytes | None] = {k: None for k, _ in self.store.items(table) if k not in new}
            out[table] = {**gone, **new}
        return out

    @property
    def checkpoint(self) -> Checkpoint:
        return self.store.checkpoint()

    def close(self) -> None:
        self.store.close()
