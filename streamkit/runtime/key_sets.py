"""A processor's store and the key set it holds: what a store written for one processor
count keeps, loses or lacks when the job runs another (linear hashing moves one
processor's keys at a time), and the stores of retired processors.

A store written for fewer processors than the job has now loses the keys that moved
away (:func:`purge_moved_keys`); one written for more lacks the keys that came back from
a retired processor: it is replaced by the staging store a shrink's bootstrap built
beside it, or emptied to be rebuilt (:func:`adopt_store`). Either way the store it
becomes names the processors retired into it (``RETIRED``: with exactly-once output, its
next incarnation announces their writers as ended).
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from assignors.linear_hashing import bucket_modulus, lh_bucket, nearest_ancestor_below
from assignors.murmur2 import key_hash
from stores.rocksdb import RocksDBStore
from streamkit.checkpoint_keys import BACKFILL, PROCESSOR_COUNT, RETIRED
from streamkit.runtime.processor import ProcessorState, StateMemory
from streamkit.state.changelog import unlogged
from streamkit.tables import Table

log = logging.getLogger(__name__)


def purge_moved_keys(proc: ProcessorState, tables: Mapping[str, Table], p0: int, p: int) -> int:
    """Delete from ``proc``'s store every key that processor count ``p`` places on another
    processor; returns how many were deleted.

    Table keys are taken to be the records' keys (as a handler that keeps state per
    record key writes them), encoded with the table's key serde; a windowed table's
    stored key ends with the 8-byte window start.
    """
    deletes: dict[str, dict[bytes, bytes | None]] = {}
    for name, table in tables.items():
        suffix = 8 if table.window is not None else 0
        gone: dict[bytes, bytes | None] = {}
        for stored, _ in proc.store.items(name):
            key = stored[:-suffix] if suffix else stored
            if lh_bucket(key_hash(key), p0, p) != proc.id:
                gone[stored] = None
        if gone:
            deletes[name] = gone
    loaded = proc.loaded
    loaded = unlogged(loaded)  # written past the changelog: the store's next checkpoint is a snapshot
    proc.store.commit(deletes, loaded.replace(extra={**loaded.extra, PROCESSOR_COUNT: p}))
    proc.loaded = proc.store.checkpoint()
    for cache in proc.caches.values():
        cache.invalidate()
    return sum(len(d) for d in deletes.values())


def adopt_windows(
    joined: ProcessorState,
    old: ProcessorState,
    tables: Mapping[str, Table],
    p0: int,
    p: int,
    read_to_seal: Collection[tuple[str, int]] = (),
) -> int:
    """At an in-place handover, both stores at T1: the joined processor's windowed tables
    and books, for its keys, become the old owner's. Returns how many entries it took.

    The joined processor rebuilt them from its own partitions' records, on its own stream
    time; the old owner applied the same records interleaved with its other partitions',
    on a stream time that may have been ahead. Where the two differ, the old owner's are
    what was sent: a window it closed and sent stays closed (rebuilt, it could still be
    open, take the records the old owner judged late, and be sent a second time), and a
    record it judged late stays out. The store is written past its changelog: its next
    checkpoint is a snapshot (as ``purge_moved_keys``).

    Only when the two stores applied the same records of its keys: the same stable offsets
    on every partition the joined processor rebuilt (on one it read only to its seal,
    ``read_to_seal``, a grown topic's old partition of its keys: the old owner there or
    beyond, where it read the other keys' records), and no individually committed records
    beyond them on either side (a key-concurrent route's, which the joined processor applies
    again after the handover). Otherwise its rebuilt windows stay, as before."""
    mine_at, old_at = joined.loaded.positions, old.loaded.positions
    if (
        not mine_at
        or any(
            old_at.get(key, -1) < at if key in read_to_seal else old_at.get(key) != at for key, at in mine_at.items()
        )
        or any(joined.loaded.ic_ranges.values())
        or any(old.loaded.ic_ranges.values())
    ):
        log.info(
            "processor %d keeps its rebuilt windows: its store and processor %d's did not apply the same records "
            "(positions %s and %s)",
            joined.id, old.id, dict(mine_at), {k: old_at.get(k) for k in mine_at},
        )  # fmt: skip
        return 0
    changes: dict[str, dict[bytes, bytes | None]] = {}
    for name, table in tables.items():
        if table.window is None:
            continue
        mine: dict[bytes, bytes | None] = {stored: None for stored, _ in joined.store.items(name)}
        for stored, value in old.store.items(name):
            if lh_bucket(key_hash(stored[:-8]), p0, p) == joined.id:
                mine[stored] = value
        if mine:
            changes[name] = mine
    if not changes:
        return 0
    loaded = unlogged(joined.loaded)
    joined.store.commit(changes, loaded)
    joined.loaded = joined.store.checkpoint()
    for cache in joined.caches.values():
        cache.invalidate()
    for state in joined.window_states.values():
        state.reindex()
    return sum(1 for per in changes.values() for v in per.values() if v is not None)


STAGING_SUFFIX = ".receiving"
"""The staging store of a shrink's receiving processor sits beside its store, so named."""


def staging_path(store: Path) -> Path:
    return store.with_name(store.name + STAGING_SUFFIX)


def store_positions(path: Path) -> dict[tuple[str, int], int]:
    """The positions of the store at ``path`` if it exists and nobody holds it (else none)."""
    try:
        with RocksDBStore.open(str(path), create=False) as store:
            return dict(store.checkpoint().positions)
    except Exception:  # noqa: BLE001 - none, or held by a worker: from the start
        return {}


def stored_count(proc: ProcessorState, p0: int) -> int | None:
    """The processor count the store's key set is for (None: an empty store)."""
    extra = proc.loaded.extra
    if PROCESSOR_COUNT in extra:
        return int(extra[PROCESSOR_COUNT])
    if BACKFILL in extra:  # a store that a backfill built, not opened since
        return int(extra[BACKFILL]["processors"])
    return None if proc.loaded.is_empty() else p0


def key_set_change(pid: int, p0: int, stored: int | None, count: int) -> str | None:
    """How processor ``pid``'s keys for ``count`` processors differ from those of a store
    written for ``stored``: "shrank" (some moved away: purge them), "grew" (some came back
    from a retired processor: the store lacks them), or None (the same keys)."""
    if stored is None or stored == count:
        return None
    had, has = bucket_modulus(pid, p0, stored), bucket_modulus(pid, p0, count)
    return None if had == has else ("shrank" if has > had else "grew")


def retired_into(pid: int, p0: int, stored: int, count: int, extra: Mapping[str, object]) -> list[int]:
    """The processors retired into ``pid`` when a store written for ``stored`` processors
    serves ``count``: those its keys came back from, and those its store still names."""
    kept = extra.get(RETIRED)
    named = {k for k in kept if isinstance(k, int) and k >= count} if isinstance(kept, list) else set()
    came = {k for k in range(count, stored) if nearest_ancestor_below(k, p0, count) == pid}
    return sorted(named | came)


def adopt_store(path: Path, count: int, retired: list[int] | None = None) -> str:
    """Make the store at ``path`` hold its processor's keys for ``count`` processors, when it
    was written for more (the processor receives a retiring one's keys): replace it by its
    staging store if that was built for ``count``, or else empty it (the member rebuilds it
    from the whole history). The staging store names the ``retired`` processors
    (``RETIRED``) before it becomes the store. Call with the store closed; returns what
    was done."""
    staging = staging_path(path)
    try:
        with RocksDBStore.open(str(staging), create=False) as store:
            loaded = store.checkpoint()
            ready = loaded.extra.get(PROCESSOR_COUNT) == count
            if ready and retired:
                store.commit({}, loaded.replace(extra={**loaded.extra, RETIRED: retired}))
    except Exception:  # noqa: BLE001 - none, held (a bootstrap still running) or broken: rebuild
        ready = False
    old = path.with_name(path.name + ".replaced")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)  # a crash from here on leaves no store: rebuilt from the history
    if ready:
        staging.rename(path)
    shutil.rmtree(old, ignore_errors=True)
    return "replaced by its staging store" if ready else "emptied, to be rebuilt"


@dataclass(frozen=True)
class StoreOpening:
    """How a worker opens its processors' stores (``ProcessorState.open``)."""

    tables: Mapping[str, Table]
    timeout: float
    """Seconds to wait for a store another process still holds (``store_open_timeout``)."""
    incarnation: str = ""
    """The job's: a store of another incarnation is refused."""
    app: str = ""
    memory: StateMemory | None = None

    async def open(self, pid: int, path: Path) -> ProcessorState:
        return await ProcessorState.open(pid, path, self.tables, self.timeout, self.incarnation, self.app, self.memory)


async def open_for_count(
    pid: int, path: Path, opening: StoreOpening, p0: int, count: int, *, log_as: str, adopt: bool = False
) -> ProcessorState:
    """Open processor ``pid``'s store at ``path`` holding its keys for ``count``
    processors: a store written for fewer loses the keys that moved away; one written for
    more lacks keys that came back: ``adopt`` its staging store, or start it empty."""
    tables = opening.tables
    proc = await opening.open(pid, path)
    stored = stored_count(proc, p0)
    change = key_set_change(pid, p0, stored, count)
    if change == "grew":
        assert stored is not None
        retired = retired_into(pid, p0, stored, count, proc.loaded.extra)
        apart = max(stored, proc.sides.p if proc.sides is not None else 0)  # (its own key sets not one yet)
        proc.close()
        if adopt:
            done = adopt_store(path, count, retired)
        else:
            shutil.rmtree(path)
            done = "emptied, to be rebuilt"
        log.info("%s: processor %d's store was for %d processors, the job has %d: %s",
                 log_as, pid, stored, count, done)  # fmt: skip
        proc = await opening.open(pid, path)
        if proc.loaded.is_empty() and retired:  # emptied: an empty store for `count` that names them
            if adopt:  # rebuilt from the history: the key sets of the count it was for on their own times
                proc.hold_sides(p0, apart)  # (not the last step's: a store two steps behind got keys from two)
            extra = proc.checkpoint_extra({PROCESSOR_COUNT: count, RETIRED: retired})
            proc.store.commit({}, proc.loaded.replace(extra=extra))
            proc.reload()
    elif change == "shrank":
        gone = purge_moved_keys(proc, tables, p0, count)
        log.info("%s: processor %d: %d keys moved to new processors, deleted", log_as, pid, gone)
    return proc


def delete_retired_stores(app_dir: Path, hosted: int) -> list[int]:
    """Delete the stores of processors ``>= hosted`` (retired by a shrink) that nobody holds;
    returns their ids."""
    gone = []
    for path in sorted(app_dir.glob("processor-*")):
        m = re.fullmatch(r"processor-(\d+)(\.behind)?", path.name)
        if m is None or int(m.group(1)) < hosted:
            continue
        if m.group(2):  # a store set aside by a restore a crash cut short (``taken_store``)
            shutil.rmtree(path, ignore_errors=True)
            continue
        try:
            RocksDBStore.open(str(path), create=False).close()
        except Exception:  # noqa: BLE001 - held by a worker, or not a store: leave it
            continue
        shutil.rmtree(path, ignore_errors=True)
        gone.append(int(m.group(1)))
    return gone
