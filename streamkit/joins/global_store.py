"""A worker's copy of a global table (``streamkit.joins.global_table``): every partition
of its topic read into a local RocksDB store, with the positions read to in the same
store batch, so that a restart reads on from there (a crash at any instant leaves the
batch whole or absent). The store is a cache of the topic: one of another incarnation
of the job, or one that cannot be opened as such, is read again from the topic's start.

1. ``catch_up``: read every partition from its position to its end as of now, in chunks,
   each chunk one store batch. A worker does this before its processors apply a record.
2. ``follow``: the same, again and again, until the worker stops.

Records a lookup cannot use are counted and said in one line per chunk, never applied:
keyless ones, and values the topic's serde cannot decode. KIP-253's copies (a compacted
layout topic's records marked as copies) are skipped as any consumer skips them.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stores.base import Checkpoint, StoreError, StoreLockedError
from stores.rocksdb import RocksDBStore
from streamkit.joins.global_table import GlobalTable
from streamkit.kafkaio import KafkaIO
from streamkit.layout.stamps import COPY_HEADER

log = logging.getLogger(__name__)

DATA = "data"
INCARNATION = "incarnation"
READ_CHUNK_BYTES = 4 << 20
"""Bytes fetched per partition and read: one store batch each."""
CACHED_LOOKUPS = 100_000
"""Stored values of the last lookups kept in memory (a hot key is not read from RocksDB)."""
_UNREAD: Any = object()
MAX_SLOTS = 64
"""Worker processes sharing a state directory, each with its copy, at most."""
FOLLOW_SECONDS = 0.5
"""How often a worker reads what its global tables' topics gained."""


@dataclass
class GlobalStoreStats:
    keys: int = 0
    """Keys held (exact: counted as records are applied)."""
    applied: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    """Records not applied, by reason: ``no key``, ``undecodable``."""
    lag: int = 0
    """Records the topic held beyond the positions at the last read."""


class GlobalStore:
    """One global table's copy on this worker; ``get`` answers the table's lookups."""

    def __init__(self, table: GlobalTable, app_dir: Path, incarnation: str = "") -> None:
        self.table = table
        self.incarnation = incarnation
        self.stats = GlobalStoreStats()
        self._kdumps = table.topic.key_serde.dumps
        self._vloads = table.topic.value_serde.loads
        self._recent: OrderedDict[bytes, bytes | None] = OrderedDict()
        """The last lookups' stored values (None: absent), ``CACHED_LOOKUPS`` at most."""
        self.path, self._store = self._open_slot(app_dir)
        cp = self._store.checkpoint()
        self.positions: dict[int, int] = {p: o for (t, p), o in cp.positions.items() if t == table.topic.name}
        self.stats.keys = int(cp.extra.get("keys", 0))

    def _open_slot(self, app_dir: Path) -> tuple[Path, RocksDBStore]:
        """The first copy in ``app_dir`` no other worker process holds: workers sharing a
        state directory keep a copy each, and a restarted one reads on from a copy an
        earlier one left."""
        for slot in range(MAX_SLOTS):
            self.path = app_dir / (f"global-{self.table.name}" + (f"-{slot}" if slot else ""))
            try:
                return self.path, self._open()
            except StoreLockedError:
                continue
        raise StoreError(f"global table {self.table.name!r}: {MAX_SLOTS} copies in {app_dir} are all in use")

    def _open(self) -> RocksDBStore:
        try:
            store = RocksDBStore.open(str(self.path), [DATA])
        except StoreLockedError:
            raise
        except StoreError as exc:  # a cache of the topic: read it again
            log.warning("global table %r: store %s not usable (%s): reading the topic again", self.table.name,
                        self.path, exc)  # fmt: skip
            shutil.rmtree(self.path, ignore_errors=True)
            return RocksDBStore.open(str(self.path), [DATA])
        stored = str(store.checkpoint().extra.get(INCARNATION, ""))
        if stored and self.incarnation and stored != self.incarnation:
            log.info("global table %r: store of another incarnation of the job: reading the topic again",
                     self.table.name)  # fmt: skip
            store.close()
            shutil.rmtree(self.path)
            return RocksDBStore.open(str(self.path), [DATA])
        return store

    # -- lookups ---------------------------------------------------------------------------
    def get(self, key: Any, default: Any = None) -> Any:
        kb = self._kdumps(key)
        data = self._recent.get(kb, _UNREAD)
        if data is _UNREAD:
            data = self._store.get(DATA, kb)
            if len(self._recent) >= CACHED_LOOKUPS:
                self._recent.popitem(last=False)  # the oldest read
            self._recent[kb] = data
        return default if data is None else self._vloads(data)  # decoded per lookup: a handler may change it

    def __len__(self) -> int:
        return self.stats.keys

    # -- reading the topic -----------------------------------------------------------------
    def apply(self, records: Sequence[Any], positions: dict[int, int]) -> None:
        """Apply ``records`` (each with ``key``, ``value``, ``headers``) and move to
        ``positions``, in one store batch."""
        changes: dict[bytes, bytes | None] = {}
        skipped = self.stats.skipped
        for r in records:
            if r.headers and any(k == COPY_HEADER for k, _ in r.headers):
                continue
            if r.key is None:
                skipped["no key"] = skipped.get("no key", 0) + 1
                continue
            if r.value is not None:
                try:
                    self._vloads(r.value)
                except Exception:  # noqa: BLE001 - any decode error: the record is left out, counted
                    skipped["undecodable"] = skipped.get("undecodable", 0) + 1
                    continue
            changes[r.key] = r.value
        keys = self.stats.keys
        for k, v in changes.items():  # exact count: a put of a new key, a delete of a held one
            held = self._store.get(DATA, k) is not None
            keys += (v is not None and not held) - (v is None and held)
        self.positions.update(positions)
        cp = Checkpoint.empty().replace(
            positions={(self.table.topic.name, p): o for p, o in self.positions.items()},
            extra={INCARNATION: self.incarnation, "keys": keys},
        )
        self._store.commit({DATA: changes}, cp)
        for k in changes:
            self._recent.pop(k, None)
        self.stats.keys = keys
        self.stats.applied += len(changes)

    async def read_on(self, io: KafkaIO) -> int:
        """Read every partition from its position to its end as of now; records read."""
        topic = self.table.topic.name
        count = await io.partition_count(topic) or 0
        ends = await io.high_watermarks(topic, range(count))
        starts = await io.log_start_offsets(topic, [p for p in range(count) if self.positions.get(p, 0) < ends[p]])
        read = 0
        before = dict(self.stats.skipped)
        behind = {p: max(0, e - self.positions.get(p, 0)) for p, e in ends.items()}
        self.stats.lag = sum(behind.values())
        for p in range(count):
            pos = max(self.positions.get(p, 0), starts.get(p, 0))
            while pos < ends[p]:
                records, nxt = await io.read(topic, p, pos, ends[p], max_bytes=READ_CHUNK_BYTES)
                self.apply(records, {p: nxt})
                read += len(records)
                pos = nxt
                behind[p] = ends[p] - pos
                self.stats.lag = sum(behind.values())
        for reason, n in self.stats.skipped.items():
            if n > before.get(reason, 0):
                log.warning("global table %r: %d record(s) of %s left out: %s", self.table.name,
                            n - before.get(reason, 0), topic, reason)  # fmt: skip
        return read

    async def catch_up(self, io: KafkaIO) -> None:
        started = time.monotonic()
        read = await self.read_on(io)
        log.info("global table %r caught up with %s in %.2f s: %d records read, %d keys", self.table.name,
                 self.table.topic.name, time.monotonic() - started, read, self.stats.keys)  # fmt: skip

    def close(self) -> None:
        self._store.close()


class GlobalStores:
    """Every global table of an app on this worker: opened, caught up before the
    processors start, then followed; bound to the app's declarations while open."""

    def __init__(self, tables: Sequence[GlobalTable], app_dir: Path, incarnation: str = "") -> None:
        self.stores = [GlobalStore(t, app_dir, incarnation) for t in tables]
        for s in self.stores:
            s.table.bind(s)

    async def catch_up(self, io: KafkaIO) -> None:
        for s in self.stores:
            await s.catch_up(io)

    async def follow(self, io: KafkaIO, every: float = FOLLOW_SECONDS) -> None:
        """Read on, every ``every`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(every)
            for s in self.stores:
                await s.read_on(io)

    def status(self) -> dict[str, dict[str, Any]]:
        """What a worker's heartbeat says of each: keys, lag, records left out by reason."""
        return {
            s.table.name: {"keys": s.stats.keys, "lag": s.stats.lag, "skipped": dict(s.stats.skipped)}
            for s in self.stores
        }

    def close(self) -> None:
        for s in self.stores:
            s.table.bind(None)
            s.close()
