"""One logical processor: its store, its tables' write-back caches, its input positions.

A processor is the unit of state (seed 001): a stable integer id, one local store, the
keys that linear hashing over the job's initial processor count sends to it. Group
members host processors; a processor can move between members, and its store goes
with its id (`App.store_path`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from stores.base import Checkpoint, StoreLockedError
from stores.cache import CachedTable
from stores.rocksdb import RocksDBStore

from streamkit.app import App

log = logging.getLogger(__name__)

Position = tuple[str, int]


class ProcessorState:
    def __init__(self, app: App, pid: int, store: RocksDBStore) -> None:
        self.app = app
        self.id = pid
        self.store = store
        self.caches = {
            name: CachedTable(store, name, table.store_key_serde, table.value_serde)
            for name, table in app.tables.items()
        }
        loaded = store.checkpoint()
        self.loaded = loaded
        # next offset to process per (topic, partition); starts at what the store holds
        self.positions: dict[Position, int] = dict(loaded.positions)
        self.uncommitted = 0

    @classmethod
    async def open(cls, app: App, pid: int, state_dir: Path, timeout: float) -> "ProcessorState":
        """Open the processor's store, waiting up to `timeout` for a previous host to let go."""
        path = app.store_path(pid, state_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            try:
                store = RocksDBStore.open(str(path), sorted(app.tables))
                return cls(app, pid, store)
            except StoreLockedError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    def bind(self) -> None:
        """Point the app's tables at this processor's caches (before its records run)."""
        tables = self.app.tables
        for name, cache in self.caches.items():
            tables[name].bind(cache)

    def commit(self, checkpoint: Checkpoint) -> None:
        """Write cached changes and `checkpoint` in one atomic batch."""
        changes = {name: cache.pending() for name, cache in self.caches.items()}
        self.store.commit(changes, checkpoint)
        self.loaded = checkpoint
        for cache in self.caches.values():
            cache.mark_clean()
        self.uncommitted = 0

    def close(self) -> None:
        for name in self.caches:
            self.app.tables[name].bind(None)
        self.store.close()
