"""A worker's copy of a global table (``streamkit.joins.global_table``): every partition
of its topic read into a local RocksDB store, with the positions read to in the same
store batch, so that a restart reads on from there (a crash at any instant leaves the
batch whole or absent). The store is a cache of the topic: one of another incarnation
of the job, or one that cannot be opened as such, is read again from the topic's start.

1. ``catch_up``: read every partition from its position to its end as it was a second
   before (``HOLE_CONFIRM_SECONDS``: a batch below that end has been written, so a gap in
   the offsets there is compaction's and is read past at once), in chunks of
   ``READ_CHUNK`` records, each chunk one store batch. A worker does this before its
   processors apply a record.
2. ``follow``: the same, again and again, until the worker stops; a failed round is
   retried (said in one line naming the table) and only ``FOLLOW_FAILURES`` in a row stop
   the worker.

Records a lookup cannot use are counted and said in one line per round: keyless ones
(left out), and values the topic's serde cannot decode (the key is deleted: a lookup
must not answer a value its topic has replaced). Records the topic deleted (retention,
deleted records) between a copy's position and its log start offset are counted too
(``lost to retention``) and said in one line naming the partition and the offsets; the
copy reads on from the log start. KIP-253's copies (a compacted layout
topic's records marked as copies) are skipped as any consumer skips them. A topic that
was deleted stops the worker with one line; one recreated under the same name (its ends
below the positions held) is read again from its start.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stores.base import Checkpoint, StoreError, StoreLockedError
from stores.rocksdb import RocksDBStore
from streamkit.joins.global_table import GlobalTable
from streamkit.kafkaio import ACKED_HOLE_WAIT, HOLE_CONFIRM_SECONDS, KafkaIO
from streamkit.layout.seal import OriginSeal
from streamkit.layout.stamps import COPY_HEADER

log = logging.getLogger(__name__)

DATA = "data"
INCARNATION = "incarnation"
SOURCE = "source"
PARTITIONS = "partitions"
READ_CHUNK = 50_000
"""Records read per store batch (the event loop runs other work between two)."""
FOLLOW_FAILURES = 10
"""Rounds of ``follow`` that may fail in a row (a broker restarting) before the worker stops."""
CACHED_LOOKUPS = 100_000
"""Stored values of the last lookups kept in memory (a hot key is not read from RocksDB)."""
_UNREAD: Any = object()
MAX_SLOTS = 64
"""Worker processes sharing a state directory, each with its copy, at most."""
FOLLOW_SECONDS = 0.5
"""How often a worker reads what its global tables' topics gained."""
LOST_TO_RETENTION = "lost to retention"
"""The reason in ``stats.skipped`` of the offsets from a copy's position up to the topic's
log start offset: the topic deleted them before the copy read them."""


class GlobalTableError(Exception):
    """A global table cannot be kept (one line naming it)."""


@dataclass
class GlobalStoreStats:
    keys: int = 0
    """Keys held (exact: counted as records are applied)."""
    applied: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    """Records not applied, by reason: ``no key``, ``undecodable``, ``lost to retention``
    (offsets deleted from the topic between the position held and its log start offset:
    at most that many records); the worker's heartbeat shows them (``streamkit status``,
    its global tables' "left out")."""
    lag: int = 0
    """Records the topic held beyond the positions at the last read."""


class GlobalStore:
    """One global table's copy on this worker; ``get`` answers the table's lookups."""

    def __init__(
        self, table: GlobalTable, app_dir: Path, incarnation: str = "", seal: OriginSeal | None = None
    ) -> None:
        self._seal = seal or OriginSeal.ephemeral()
        """Tells the copies for compaction streamkit wrote from records carrying the header."""
        self.table = table
        self.incarnation = incarnation
        self.stats = GlobalStoreStats()
        self._kdumps = table.topic.key_serde.dumps
        self._vloads = table.topic.value_serde.loads
        self._recent: OrderedDict[bytes, bytes | None] = OrderedDict()
        """The last lookups' stored values (None: absent), ``CACHED_LOOKUPS`` at most."""
        self.path, self._store = self._open_slot(app_dir)
        cp = self._store.checkpoint()
        self.partitions: int | None = cp.extra.get(PARTITIONS)
        """The topic's partition count when it was first read (a change is refused)."""
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
        extra = store.checkpoint().extra
        stored, source = str(extra.get(INCARNATION, "")), str(extra.get(SOURCE, self.table.topic.name))
        if (stored and self.incarnation and stored != self.incarnation) or source != self.table.topic.name:
            log.info("global table %r: store of another incarnation of the job or of another topic (%s): reading "
                     "%s again", self.table.name, source, self.table.topic.name)  # fmt: skip
            store.close()
            shutil.rmtree(self.path)
            return RocksDBStore.open(str(self.path), [DATA])
        return store

    def _start_over(self) -> None:
        """Forget everything held (the topic was recreated): read it again from its start."""
        self._store.close()
        shutil.rmtree(self.path)
        self._store = RocksDBStore.open(str(self.path), [DATA])
        self.positions.clear()
        self._recent.clear()
        self.stats.keys = 0

    # -- lookups ---------------------------------------------------------------------------
    def get(self, key: Any, default: Any = None) -> Any:
        if key is None:  # a record without the foreign key: nothing to look up
            return default
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

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every key's stored bytes (key, value), in key order."""
        return self._store.items(DATA)

    # -- reading the topic -----------------------------------------------------------------
    def apply(self, records: Sequence[Any], positions: dict[int, int]) -> None:
        """Apply ``records`` (each with ``key``, ``value``, ``headers``) and move to
        ``positions``, in one store batch."""
        changes: dict[bytes, bytes | None] = {}
        skipped = self.stats.skipped
        for r in records:
            if (
                r.headers
                and r.headers[0][0] == COPY_HEADER
                and self._seal.copy_of(self.table.topic.name, r) is not None
            ):
                continue  # a copy for compaction streamkit wrote: its original is applied where it lies
            if r.key is None:
                skipped["no key"] = skipped.get("no key", 0) + 1
                continue
            value = r.value
            if value is not None:
                try:
                    self._vloads(value)
                except Exception:  # noqa: BLE001 - any decode error: counted, and the key's old value is gone
                    skipped["undecodable"] = skipped.get("undecodable", 0) + 1
                    value = None
            changes[r.key] = value
        keys = self.stats.keys
        for k, v in changes.items():  # exact count: a put of a new key, a delete of a held one
            held = self._store.get(DATA, k) is not None
            keys += (v is not None and not held) - (v is None and held)
        moved = {**self.positions, **positions}
        cp = Checkpoint.empty().replace(
            positions={(self.table.topic.name, p): o for p, o in moved.items()},
            extra={
                INCARNATION: self.incarnation,
                SOURCE: self.table.topic.name,
                PARTITIONS: self.partitions,
                "keys": keys,
            },  # fmt: skip
        )
        self._store.commit({DATA: changes}, cp)
        self.positions = moved
        for k in changes:
            self._recent.pop(k, None)
        self.stats.keys = keys
        self.stats.applied += len(changes)

    async def read_on(self, io: KafkaIO) -> int:
        """Read every partition from its position to its end as of a second ago; records read."""
        topic = self.table.topic.name
        count = await io.partition_count(topic)
        if count is None:
            raise GlobalTableError(f"global table {self.table.name!r}: its topic {topic!r} does not exist (any more)")
        ends = await io.high_watermarks(topic, range(count))
        held = self._store.checkpoint().extra.get(PARTITIONS)
        recreated = any(self.positions.get(p, 0) > end for p, end in ends.items())
        if held is not None and held != count and not recreated:
            raise GlobalTableError(
                f"global table {self.table.name!r}: topic {topic!r} went from {held} to {count} partitions, so a "
                f"key's values may lie in two of them; give the table a topic whose partitions never change"
            )
        self.partitions = count
        if recreated:
            log.warning("global table %r: topic %s ends below the positions held (it was recreated): reading it "
                        "again from its start", self.table.name, topic)  # fmt: skip
            self._start_over()
        behind = {p: max(0, e - self.positions.get(p, 0)) for p, e in ends.items()}
        self.stats.lag = sum(behind.values())
        if not self.stats.lag:
            return 0
        await asyncio.sleep(HOLE_CONFIRM_SECONDS)  # every batch below these ends is written by now
        starts = await io.log_start_offsets(topic, [p for p, n in behind.items() if n])
        read = 0
        before = dict(self.stats.skipped)
        for p in range(count):
            pos = self._read_from(p, starts.get(p, 0))
            while pos < ends[p]:
                stop = min(pos + READ_CHUNK, ends[p])
                records, nxt = await io.read(topic, p, pos, stop, hole_wait=ACKED_HOLE_WAIT)
                self.apply(records, {p: nxt})
                read += len(records)
                pos = nxt
                behind[p] = ends[p] - pos
                self.stats.lag = sum(behind.values())
                await asyncio.sleep(0)  # the processors run between two chunks
        for reason, n in self.stats.skipped.items():
            if n > before.get(reason, 0) and reason != LOST_TO_RETENTION:  # (said per partition, with its offsets)
                log.warning("global table %r: %d record(s) of %s %s: %s", self.table.name, n - before.get(reason, 0),
                            topic, "left out" if reason == "no key" else "deleted their key", reason)  # fmt: skip
        return read

    def _read_from(self, partition: int, start: int) -> int:
        """Where to read ``partition`` from: its position held, or the log start offset
        ``start`` when the topic no longer holds the records from there. Those records are
        lost to this copy (their keys keep an older value, or none): said in one line with
        the offsets and counted in ``stats.skipped``. A partition with no position held has
        lost nothing: the copy never read it, so it reads whatever the topic holds."""
        held = self.positions.get(partition)
        if held is None or held >= start:
            return max(held or 0, start)
        skipped = self.stats.skipped
        skipped[LOST_TO_RETENTION] = skipped.get(LOST_TO_RETENTION, 0) + start - held
        log.warning(
            "global table %r: %s[%d] offsets %d..%d were deleted (retention or deleted records) before this copy "
            "read them: up to %d record(s) skipped, so lookups of their keys may answer an older value, or none",
            self.table.name, self.table.topic.name, partition, held, start - 1, start - held,
        )  # fmt: skip
        self.apply([], {partition: start})  # held past them: counted and said once, however long it reads nothing
        return start

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

    def __init__(
        self, tables: Sequence[GlobalTable], app_dir: Path, incarnation: str = "", seal: OriginSeal | None = None
    ) -> None:
        self.stores: list[GlobalStore] = []
        try:
            for t in tables:
                self.stores.append(GlobalStore(t, app_dir, incarnation, seal))
        except BaseException:
            self.close()
            raise
        for s in self.stores:
            s.table.bind(s)

    async def catch_up(self, io: KafkaIO) -> None:
        for s in self.stores:
            await s.catch_up(io)

    async def follow(self, io: KafkaIO, every: float = FOLLOW_SECONDS) -> None:
        """Read on, every ``every`` seconds, until cancelled; a round that fails is retried,
        ``FOLLOW_FAILURES`` in a row stop the worker (one line naming the table)."""
        failures = 0
        while True:
            await asyncio.sleep(every)
            for s in self.stores:
                try:
                    await s.read_on(io)
                    failures = 0
                except GlobalTableError:
                    raise
                except Exception as exc:  # noqa: BLE001 - a broker restarting: said, retried
                    failures += 1
                    if failures >= FOLLOW_FAILURES:
                        raise GlobalTableError(
                            f"global table {s.table.name!r}: {failures} reads of {s.table.topic.name} failed in a "
                            f"row, the last with {type(exc).__name__}: {exc}"
                        ) from exc
                    log.warning("global table %r: reading %s failed (%s: %s); trying again", s.table.name,
                                s.table.topic.name, type(exc).__name__, exc)  # fmt: skip

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
