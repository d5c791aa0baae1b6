"""One logical processor: its store, its tables' write-back caches, its input positions.

A processor is the unit of state: a stable integer id, one local store, the keys that
linear hashing over the job's initial processor count sends to it. Group members host
processors; a processor can move between members, and its store goes with its id
(`App.store_path`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stores.base import Checkpoint, StoreLockedError
from stores.cache import CacheBudget, CachedTable
from stores.rocksdb import PreparedCommit, RocksDBStore, SharedMemory
from streamkit.checkpoint_keys import INCARNATION, RETIRED, SEEN_STRAYS, STREAM_TIME
from streamkit.errors import StreamkitError
from streamkit.exactly_once.reader import EOS_SEEN, CommitGate
from streamkit.exactly_once.writer import EOS_COMMITTED, AttemptWriter
from streamkit.layout.strays import SeenStrays
from streamkit.runtime.icranges import Range, compact, snapshot
from streamkit.runtime.sides import SIDES, SideClocks
from streamkit.sinks.outbox import SINK_OUTBOX, SinkOutbox
from streamkit.state.changelog import teed_changes
from streamkit.tables import Table
from streamkit.windows import WindowedTable

log = logging.getLogger(__name__)

Position = tuple[str, int]


class StaleStoreError(StreamkitError):
    """A local store belongs to another incarnation of the job (another cluster, or the
    job was reset): its positions mean nothing here."""


def stale_store_message(path: Path | str, app: str, stored: str, current: str) -> str:
    return (
        f"store {path} belongs to another incarnation of job {app!r} (store: {stored}, cluster: {current}): "
        f"the cluster is a new one or the job was reset; discard the local stores with "
        f"`streamkit reset MODULE:APP` (or use another state_dir)"
    )


@dataclass(frozen=True)
class StateMemory:
    """The memory the state of a worker's processors may use, whatever the number of keys:
    RocksDB's block cache and memtables shared by every store, and the write-back caches
    of every table sharing one byte budget."""

    rocksdb: SharedMemory
    caches: CacheBudget

    @classmethod
    def of(cls, cache_bytes: int, block_cache_bytes: int, memtable_bytes: int) -> StateMemory:
        return cls(SharedMemory(block_cache_bytes, memtable_bytes), CacheBudget(cache_bytes))


UNBOUNDED_ENTRIES = 1 << 40
"""With a byte budget the entry count is not what limits a cache."""


class ProcessorState:
    def __init__(
        self,
        pid: int,
        store: RocksDBStore,
        tables: Mapping[str, Table],
        incarnation: str = "",
        memory: StateMemory | None = None,
    ) -> None:
        self.id = pid
        self.store = store
        self.incarnation = incarnation
        """Stamped into every checkpoint ("": none known)."""
        bound: dict[str, Any] = {} if memory is None else {"max_cached": UNBOUNDED_ENTRIES, "budget": memory.caches}
        self.caches = {
            name: CachedTable(store, name, table.store_key_serde, table.value_serde, **bound)
            for name, table in tables.items()
        }
        loaded = store.checkpoint()
        self.loaded = loaded
        # next offset to process per (topic, partition); starts at what the store holds
        self.positions: dict[Position, int] = dict(loaded.positions)
        self.ahead: dict[Position, list[Range]] = {k: list(v) for k, v in loaded.ic_ranges.items() if v}
        """IC ranges of the last checkpoint the positions have not reached: applied already."""
        self.pending: dict[Position, set[int]] = {}
        """Offsets below the positions handed to handlers and not finished (key-level concurrency)."""
        self.uncommitted = 0
        self.window_states = {
            name: t.state_over(self.caches[name], self.caches.get(t.book_name))
            for name, t in tables.items()
            if isinstance(t, WindowedTable)
        }
        """Per windowed table: its windows, book and close index (``streamkit.windows.state``)."""
        self.windows = {name: state.kind for name, state in self.window_states.items()}
        self.backends: dict[str, Any] = {**self.caches, **self.window_states}
        """What the tables are bound to while this processor runs."""
        self.stream_time = int(loaded.extra.get(STREAM_TIME, -1)) if self.windows else -1
        """The largest record timestamp applied (ms; -1: none, or no windowed table); with
        ``close_on="wall"`` the wall clock moves it too."""
        self.fired_through = -1
        """The close bound of the processor's last close check: every window that closes by
        then has closed (and, live, been sent; a rollback does not unsend it, so it stays).
        -1: none since the store was opened."""
        self._key_dumps = {name: t.key_serde.dumps for name, t in tables.items() if isinstance(t, WindowedTable)}
        self.sides = SideClocks.from_extra(loaded.extra, self._key_dumps) if self.windows else None
        """A shrink's staging store until it goes live: the stream time of each key set
        (``sides``); None: one stream time."""
        self.stream_at: dict[tuple[str, int, int], int] = {}
        """Stream time of records queued for (or running in) key-concurrent handlers, fixed
        in offset order."""
        self.seen_strays = SeenStrays(dict(loaded.extra.get(SEEN_STRAYS, {})))
        """The forwarded strays applied: a second copy of one is dropped."""
        self.commit_gate: CommitGate | None = None
        """What its inputs' markers said (``processing="exactly_once"``; set by its host)."""
        self.attempts: AttemptWriter | None = None
        """Its output attempts (``processing="exactly_once"``, live; set by its host)."""
        self.sink_outbox: SinkOutbox | None = None
        """Its sink rows since the last checkpoint (live, when the app has sinks; set by its host)."""

    def rewind(self) -> None:
        """Forget progress beyond the last checkpoint (call right after one): positions and
        IC ranges as checkpointed, nothing pending."""
        self.positions = dict(self.loaded.positions)
        self.ahead = {k: list(v) for k, v in self.loaded.ic_ranges.items() if v}
        self.pending.clear()
        self.seen_strays = SeenStrays(dict(self.loaded.extra.get(SEEN_STRAYS, {})))
        if self.commit_gate is not None:
            self.commit_gate.load(self.loaded.extra)
        if self.windows:
            self.stream_time = int(self.loaded.extra.get(STREAM_TIME, -1))
            self.sides = SideClocks.from_extra(self.loaded.extra, self._key_dumps)
            self.stream_at.clear()
            for state in self.window_states.values():
                state.reindex()

    def reload(self) -> None:
        """Take the store as it is now (written directly, not through the caches): its
        checkpoint and state, nothing cached, nothing pending."""
        self.loaded = self.store.checkpoint()
        for cache in self.caches.values():
            cache.invalidate()
        self.rewind()

    def advance(self, timestamp_ms: int, key: bytes | None = None) -> int:
        """Stream time with a record of ``timestamp_ms`` (and record key ``key``) applied,
        as the record is judged by it: its key set's, while the store holds two (-1: not
        tracked)."""
        if self.windows and timestamp_ms > self.stream_time:
            self.stream_time = timestamp_ms
        if self.sides is not None:
            return self.sides.advance(key, timestamp_ms)
        return self.stream_time

    def hold_sides(self, p0: int, p: int) -> None:
        """The store holds the keys of ``p`` processors' two key sets (a shrink's staging
        store): each goes on with its own stream time until :meth:`merge_sides`."""
        if self.windows and self.sides is None:
            self.sides = SideClocks(p0, p, {}, self._key_dumps)

    def merge_sides(self) -> None:
        """The store's key sets are one processor's now (it applies records live): one
        stream time, the larger."""
        self.sides = None

    def close_bound(self) -> int:
        """How far windows may close now: stream time, held back to the oldest record a
        key-concurrent handler has not finished (it may still write a window that stream
        time alone would close)."""
        for held in self.stream_at.values():  # fixed in offset order: the first is the oldest
            return min(self.stream_time, held)
        return self.stream_time

    def expire_windows(self) -> int:
        """Delete the windows past their retention (through the caches: part of the next
        checkpoint's batch; ``WindowState.expire``). Returns how many were deleted."""
        bound = self.close_bound()  # (a window a queued record may still write is kept)
        if self.sides is not None and self.sides.times:  # a key set behind the other: its windows stay
            bound = min(bound, *self.sides.times.values())
        deleted = sum(state.expire(bound) for state in self.window_states.values())
        self.uncommitted += deleted
        return deleted

    def stable(self) -> tuple[dict[Position, int], dict[Position, list[Range]]]:
        """What a checkpoint records now: per partition the stable offset (everything below
        is applied) and the IC ranges (applied beyond it; ``icranges``)."""
        positions: dict[Position, int] = {}
        ranges: dict[Position, list[Range]] = {}
        for key, cursor in self.positions.items():
            ahead = self.ahead.get(key)
            if ahead:
                ahead = self.ahead[key] = compact(ahead, cursor)
            positions[key], found = snapshot(self.pending.get(key, ()), cursor, ahead or ())
            if found:
                ranges[key] = found
        return positions, ranges

    @classmethod
    async def open(
        cls,
        pid: int,
        path: Path,
        tables: Mapping[str, Table],
        timeout: float,
        incarnation: str = "",
        app: str = "",
        memory: StateMemory | None = None,
    ) -> ProcessorState:
        """Open the processor's store at `path`, waiting up to `timeout` for a previous host
        to let go of it; refuse a store of another incarnation of the job
        (:class:`StaleStoreError`)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            try:
                store = RocksDBStore.open(str(path), sorted(tables), configure=memory.rocksdb if memory else None)
                stored = str(store.checkpoint().extra.get(INCARNATION, ""))
                if incarnation and stored and stored != incarnation:
                    store.close()
                    raise StaleStoreError(stale_store_message(path, app, stored, incarnation))
                return cls(pid, store, tables, incarnation, memory)
            except StoreLockedError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    def checkpoint_extra(
        self,
        extra: Mapping[str, Any],
        positions: Mapping[Position, int] | None = None,
        ranges: Mapping[Position, Sequence[Range]] | None = None,
    ) -> dict[str, Any]:
        """``extra`` as this processor's checkpoints carry it (with the job's incarnation);
        ``positions`` and IC ``ranges``: the checkpoint's (default: :meth:`stable`'s)."""
        out = dict(extra)
        if self.incarnation:
            out[INCARNATION] = self.incarnation
        if self.windows and self.stream_time >= 0:
            out[STREAM_TIME] = self.stream_time
        if self.sides is not None:
            out[SIDES] = self.sides.to_extra()
        if positions is None:
            positions, ranges = self.stable()
        if strays_seen := self.seen_strays.table_at(positions, ranges or {}):  # (the copies applied: none held)
            out[SEEN_STRAYS] = strays_seen
        if self.commit_gate is not None and (seen := self.commit_gate.to_extra(positions)):
            out[EOS_SEEN] = seen
        elif EOS_SEEN in self.loaded.extra:
            out[EOS_SEEN] = self.loaded.extra[EOS_SEEN]
        if self.attempts is not None and (committing := self.attempts.committing()) is not None:
            out[EOS_COMMITTED] = committing
        elif EOS_COMMITTED in self.loaded.extra:
            out[EOS_COMMITTED] = self.loaded.extra[EOS_COMMITTED]
        if self.attempts is not None:
            if retired := self.attempts.retired_owed():
                out[RETIRED] = retired
        elif RETIRED in self.loaded.extra:
            out[RETIRED] = self.loaded.extra[RETIRED]
        if self.sink_outbox is not None and (rows := self.sink_outbox.to_extra()) is not None:
            out[SINK_OUTBOX] = rows
        elif SINK_OUTBOX in self.loaded.extra:
            out[SINK_OUTBOX] = self.loaded.extra[SINK_OUTBOX]
        return out

    def commit(self, checkpoint: Checkpoint) -> None:
        """Write cached changes and `checkpoint` in one atomic batch."""
        self.finish_commit(self.store.prepare({name: c.changes() for name, c in self.caches.items()}), checkpoint)

    def prepare_commit(self, add: Callable[[bytes, bytes | None], None]) -> PreparedCommit:
        """The store batch of the caches' changes, each also handed to ``add`` as it is
        serialised (the changelog's records); written by :meth:`finish_commit`. Nothing
        may change the tables in between (the member's lock is held)."""
        return self.store.prepare(teed_changes(self.caches, add))

    def finish_commit(self, prepared: PreparedCommit, checkpoint: Checkpoint) -> None:
        """Write ``prepared`` and ``checkpoint`` in one atomic batch (:meth:`commit`'s end)."""
        checkpoint = checkpoint.replace(
            extra=self.checkpoint_extra(checkpoint.extra, checkpoint.positions, checkpoint.ic_ranges)
        )
        prepared.finish(checkpoint)
        if self.commit_gate is not None:
            self.commit_gate.compact(checkpoint.positions)
        self.seen_strays.compact(checkpoint.positions, checkpoint.ic_ranges)
        if self.attempts is not None:
            self.attempts.stored()
        if self.sink_outbox is not None:
            self.sink_outbox.committed()
        for cache in self.caches.values():
            cache.mark_clean()
        self.loaded = checkpoint
        self.uncommitted = 0

    def discard(self) -> None:
        """Drop the changes made since the last checkpoint."""
        for cache in self.caches.values():
            cache.discard()

    def close(self) -> None:
        for cache in self.caches.values():
            cache.release()
        self.store.close()


def check_local_stores(app_dir: Path, app: str, incarnation: str) -> None:
    """Refuse to start on local stores of another incarnation of the job (one line naming
    the store, both ids and the way out). Stores held by a running worker are its own
    business; a store without an incarnation (written before they existed) is adopted."""
    if not incarnation or not app_dir.is_dir():
        return
    for path in sorted(app_dir.iterdir()):
        if not path.is_dir() or re.fullmatch(r"processor-\d+", path.name) is None:
            continue  # staging stores are checked when a bootstrap opens them
        try:
            store = RocksDBStore.open(str(path), create=False)
        except StoreLockedError:
            continue
        try:
            stored = str(store.checkpoint().extra.get(INCARNATION, ""))
        finally:
            store.close()
        if stored and stored != incarnation:
            raise StaleStoreError(stale_store_message(path, app, stored, incarnation))
