"""One logical processor: its store, its tables' write-back caches, its input positions.

A processor is the unit of state: a stable integer id, one local store, the keys that
linear hashing over the job's initial processor count sends to it. Group members host
processors; a processor can move between members, and its store goes with its id
(`App.store_path`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from pathlib import Path

from stores.base import Checkpoint, StoreLockedError
from stores.cache import CachedTable, commit_cached
from stores.rocksdb import RocksDBStore
from streamkit.runtime.icranges import Range, compact, snapshot
from streamkit.tables import Table

log = logging.getLogger(__name__)

Position = tuple[str, int]


class ProcessorState:
    def __init__(self, pid: int, store: RocksDBStore, tables: Mapping[str, Table]) -> None:
        self.id = pid
        self.store = store
        self.caches = {
            name: CachedTable(store, name, table.store_key_serde, table.value_serde) for name, table in tables.items()
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

    def rewind(self) -> None:
        """Forget progress beyond the last checkpoint (call right after one): positions and
        IC ranges as checkpointed, nothing pending."""
        self.positions = dict(self.loaded.positions)
        self.ahead = {k: list(v) for k, v in self.loaded.ic_ranges.items() if v}
        self.pending.clear()

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
    async def open(cls, pid: int, path: Path, tables: Mapping[str, Table], timeout: float) -> ProcessorState:
        """Open the processor's store at `path`, waiting up to `timeout` for a previous host
        to let go of it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            try:
                store = RocksDBStore.open(str(path), sorted(tables))
                return cls(pid, store, tables)
            except StoreLockedError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    def commit(self, checkpoint: Checkpoint) -> None:
        """Write cached changes and `checkpoint` in one atomic batch."""
        commit_cached(self.store, self.caches.values(), checkpoint)
        self.loaded = checkpoint
        self.uncommitted = 0

    def discard(self) -> None:
        """Drop the changes made since the last checkpoint."""
        for cache in self.caches.values():
            cache.discard()

    def close(self) -> None:
        self.store.close()
