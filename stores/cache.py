"""Write-back cache of one store table, holding *deserialised* values.

The processor loop's per-record state access goes through ``CachedTable``:
``get`` is one dict lookup on a hit, ``__setitem__`` is two dict stores (the
cache, and the dirty entries of this checkpoint interval).  Nothing is serialised and RocksDB is not touched until the
checkpoint, when :meth:`CachedTable.pending` serialises each dirty key once
(however often it was updated) and the runtime commits all tables together
with the checkpoint::

    changes = {t.table: t.pending() for t in tables}
    store.commit(changes, checkpoint)        # atomic
    for t in tables: t.mark_clean()          # (or commit_cached(store, tables, cp))

Misses are cached too (a negative entry), so a key that is looked up again and
again and does not exist costs one store read per residency, not one per call.
A lookup tells a miss by ``dict.get`` with a sentinel, not by catching ``KeyError``:
at a million keys about half the lookups miss, and raising the exception for each
cost a worker 7% of its throughput (229,586 vs 247,393 records/s, median of 3;
no difference measured at 10,000 keys, where nearly every lookup hits).

Rules for callers:

- Keys must be hashable and the key serde canonical: equal keys must
  serialise to equal bytes (beware ``1 == True`` with JSON).
- Values are returned *live*: after mutating one in place, assign it back
  (``t[k] = v``) or the change is not marked dirty and will not be committed.
- If ``store.commit`` fails nothing was written (commits are atomic): call
  :meth:`discard` to drop the uncommitted updates (then reprocess from the
  store's checkpoint), or keep them and retry the commit.
- If the store is changed by anything other than this table's own commits
  (a restore, another ``CachedTable`` on the same table), call
  :meth:`invalidate`: until then a key written that way may read as absent (the
  filter of stored keys, ``stores.stored_keys``, does not know it).

Dirty entries.  The keys changed since the last checkpoint are kept with their
values in a second dict, so a checkpoint serialises them from there: at a million
keys, looking each one up again in the cache (memory the CPU cache has long lost)
cost more than serialising it.

Memory bound.  ``max_cached`` is enforced in :meth:`mark_clean` (between
checkpoints only dirty entries are pinned, and they must stay).  Eviction is a
clock over dict insertion order: entries are taken from the front; one written
during the last interval gets a second chance (it moves to the back), any other
is dropped, until ``max_cached`` remain.  Keys that are only read drift to the
front and are evicted first; a read-hot key evicted this way costs one store
read to come back.  Neither reads nor writes reorder entries on the hot path,
and a checkpoint touches only the entries at the front, not every key written.

Byte bound.  With a :class:`CacheBudget` the limit is also in bytes: a share of the
budget's bytes turned into an entry count (``stores.cache_budget``).

Measured with ``python tests/stores/bench_cache.py`` on the 2-core reference
machine while shared with other work (so read as upper bounds):

- hot ``t[k] = t.get(k, 0) + 1`` over 10k keys: 3.1-4.9 M pairs/s (205-320 ns;
  a plain dict does the same in 80-90 ns; per-record rocksdict get + put with
  orjson: 240-400 k/s).  Single ops: ``get`` hit ~43 ns, ``__setitem__`` ~64 ns.
- checkpoint of 10k dirty keys (int keys, small JSON dict values), thread CPU:
  ``pending()`` ~7 ms + ``store.commit`` (RocksDB, one WriteBatch) ~6 ms +
  ``mark_clean`` 0.1 ms, i.e. ~1.3 us per dirty key.  ``pending()`` alone for
  10k JSON values measured in isolation: 18-24 ms with glibc's default malloc,
  2.5 ms after :func:`stores.tuning.relax_malloc_trim` (see there).
- cold misses (store read + decode + cache fill): 500-830 k/s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import islice
from typing import Any, NamedTuple

from . import stored_keys
from .base import Checkpoint, Store, StoreError
from .cache_budget import ENTRY_OVERHEAD, SAMPLE, CacheBudget, deep_size
from .cache_changes import _ABSENT, PendingChanges
from .serde import IntSerde, JsonSerde, RawSerde, Serde, StrSerde, serde_for
from .stored_keys import StoredKeys

__all__ = ["CacheBudget", "CachedTable", "HotPath", "PendingChanges", "commit_cached", "deep_size"]

_MISSING: Any = object()


class HotPath(NamedTuple):
    """A :class:`CachedTable`'s reads and writes without calling it (:meth:`CachedTable.hot_path`)."""

    cache: dict[Any, Any]
    dirty: dict[Any, Any]
    load: Callable[[Any], Any]
    absent: Any


_PLAIN_SERDES = (JsonSerde, RawSerde, StrSerde, IntSerde)
_PLAIN_TYPES = frozenset((str, bytes, int, float, bool))


class CachedTable:
    """A dict-like view of ``store``'s table ``table`` with a write-back cache."""

    __slots__ = (
        "store",
        "table",
        "key_serde",
        "value_serde",
        "max_cached",
        "budget",
        "entry_bytes",
        "_cache",
        "_dirty",
        "_kdumps",
        "_kloads",
        "_vdumps",
        "_vloads",
        "misses",
        "reads_spared",
        "_stored",
        "_rescan",
        "_plain_keys",
    )

    def __init__(
        self,
        store: Store,
        table: str,
        key_serde: Serde | str | None = "json",
        value_serde: Serde | str | None = "json",
        *,
        max_cached: int = 100_000,
        budget: CacheBudget | None = None,
    ) -> None:
        if table not in store.tables:
            raise StoreError(f"unknown table {table!r} in store {store.name} (tables: {', '.join(store.tables)})")
        if max_cached < 0:
            raise ValueError(f"max_cached must be >= 0, got {max_cached}")
        self.store = store
        self.table = table
        self.key_serde = serde_for(key_serde)
        self.value_serde = serde_for(value_serde)
        self.max_cached = max_cached
        self.budget = budget
        """Bytes this table may use, shared with the budget's other tables (None: entries only)."""
        self.entry_bytes = 0.0
        """Estimated bytes of one cached entry (0: not measured yet)."""
        if budget is not None:
            budget.join()
        self._cache: dict[Any, Any] = {}
        self._dirty: dict[Any, Any] = {}
        """The entries changed since the last checkpoint, as in the cache (``_ABSENT``: deleted)."""
        self._kdumps = self.key_serde.dumps
        self._kloads = self.key_serde.loads
        self._vdumps = self.value_serde.dumps
        self._vloads = self.value_serde.loads
        self.misses = 0
        """Reads the cache could not answer."""
        self.reads_spared = 0
        """Misses the filter of stored keys answered (a key the store lacks) without a store read."""
        self._plain_keys = type(self.key_serde) in _PLAIN_SERDES
        """Keys of plain types come back from the serde as they went in (same hash)."""
        self._stored: StoredKeys | None = None
        """The keys the table may hold but the cache may not (None: every miss reads the store)."""
        self._rescan = True
        """The filter must be built again (from a scan) before it answers: at the next
        :meth:`mark_clean`; False with no filter means the table is too big to scan."""
        self._scan()

    # -- the hot path ----------------------------------------------------------

    def _load(self, key: Any) -> Any:
        self.misses += 1
        stored = self._stored
        if stored is not None:
            try:
                absent = not stored.may_hold(
                    key if self._plain_keys and type(key) in _PLAIN_TYPES else self._canonical(key)
                )
            except TypeError:  # it comes back unhashable (a tuple through JSON): no filter
                self._stored, absent = None, False
            if absent:
                self.reads_spared += 1
                self._cache[key] = _ABSENT
                return _ABSENT
        data = self.store.get(self.table, self._kdumps(key))
        value = _ABSENT if data is None else self._vloads(data)
        self._cache[key] = value
        return value

    def hot_path(self) -> HotPath:
        """What a caller with a dict-like API over this table may use instead of calling
        it, one Python call less per read and per write (``streamkit.tables.Table``:
        nearly every record reads a key and writes it back). A read is
        ``cache.get(key)``, then ``load(key)`` if the key is not there; ``absent`` is the
        value of a key the table does not hold. A write is ``cache[key] = dirty[key] =
        value``, as :meth:`__setitem__` does. The dicts are the table's own for its whole
        life: they are cleared, never replaced."""
        return HotPath(self._cache, self._dirty, self._load, _ABSENT)

    def get(self, key: Any, default: Any = None) -> Any:
        value = self._cache.get(key, _MISSING)
        if value is _MISSING:
            value = self._load(key)
        return default if value is _ABSENT else value

    def __getitem__(self, key: Any) -> Any:
        value = self._cache.get(key, _MISSING)
        if value is _MISSING:
            value = self._load(key)
        if value is _ABSENT:
            raise KeyError(key)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:  # (a write as hot_path() tells it)
        self._cache[key] = value
        self._dirty[key] = value

    def __delitem__(self, key: Any) -> None:
        self.pop(key)

    def __contains__(self, key: Any) -> bool:
        value = self._cache.get(key, _MISSING)
        if value is _MISSING:
            value = self._load(key)
        return value is not _ABSENT

    def setdefault(self, key: Any, default: Any = None) -> Any:
        value = self._cache.get(key, _MISSING)
        if value is _MISSING:
            value = self._load(key)
        if value is _ABSENT:
            self._cache[key] = default
            self._dirty[key] = default
            return default
        return value

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        value = self._cache.get(key, _MISSING)
        if value is _MISSING:
            value = self._load(key)
        if value is _ABSENT:
            if default is _MISSING:
                raise KeyError(key)
            return default
        self._cache[key] = _ABSENT
        self._dirty[key] = _ABSENT
        return value

    # -- checkpoint support ----------------------------------------------------

    def pending(self) -> dict[bytes, bytes | None]:
        """The uncommitted changes, serialised: ``{key_bytes: value_bytes or None (delete)}``.
        Does not change the cache; call :meth:`mark_clean` once they are committed."""
        kdumps = self._kdumps
        vdumps = self._vdumps
        return {kdumps(k): (None if v is _ABSENT else vdumps(v)) for k, v in self._dirty.items()}

    def changes(self) -> PendingChanges:
        """The same changes as :meth:`pending`, serialised one at a time as a commit reads
        them: a commit of many keys never holds all their serialised values at once."""
        return PendingChanges(self._dirty, self._kdumps, self._vdumps, raw_keys=type(self.key_serde) is RawSerde)

    @property
    def dirty_count(self) -> int:
        """Keys changed since the last :meth:`mark_clean` (a checkpoint trigger)."""
        return len(self._dirty)

    @property
    def cached_count(self) -> int:
        """Entries in the cache, negative ones included."""
        return len(self._cache)

    @property
    def limit(self) -> int:
        """Entries kept after a checkpoint: ``max_cached``, or fewer if the budget's
        share would be exceeded."""
        if self.budget is None or not self.entry_bytes:
            return self.max_cached
        return min(self.max_cached, int(self.budget.share / self.entry_bytes))

    def _measure(self) -> None:
        sizes = [
            deep_size(k) + (0 if v is _ABSENT else deep_size(v)) + ENTRY_OVERHEAD
            for k, v in islice(self._dirty.items(), SAMPLE)
        ]
        if sizes:
            now = sum(sizes) / len(sizes)
            self.entry_bytes = now if not self.entry_bytes else 0.75 * self.entry_bytes + 0.25 * now

    def mark_clean(self) -> None:
        """The pending changes are committed: forget they are dirty and
        enforce the limit (see module doc)."""
        cache = self._cache
        dirty = self._dirty
        stored = self._stored
        if self.budget is not None:
            self._measure()
        excess = len(cache) - self.limit
        if stored is not None and excess > 0 and stored.empty and stored.capacity < self.limit + excess:
            # the first keys let go: an empty filter is made as big as the cache for free
            # (later, one that fills up is built again from a scan of the whole table)
            stored = self._stored = StoredKeys(min(self.limit + excess, stored_keys.SCAN_LIMIT))
        spared = 0  # each written entry is spared once: the loop ends
        while excess > 0:
            for k in list(islice(cache, excess)):
                if spared < len(dirty) and k in dirty:
                    cache[k] = cache.pop(k)  # written in the last interval: a second chance
                    spared += 1
                else:
                    value = cache.pop(k)
                    excess -= 1
                    if stored is not None and value is not _ABSENT:  # the store holds it
                        stored = self._learn(stored, k)
        dirty.clear()
        if self._rescan or (stored is not None and stored.full):
            self._scan(0 if stored is None else 2 * stored.capacity)

    def _scan(self, capacity: int = 0) -> None:
        """Build the filter of stored keys from a scan of the table's committed keys (none
        if there are more than ``SCAN_LIMIT``, or a key does not load or hash)."""
        self._stored, self._rescan = None, False
        try:
            self._stored = StoredKeys.scan(
                self._stored_keys, self._kloads, limit=stored_keys.SCAN_LIMIT, capacity=max(capacity, 1)
            )
        except Exception:  # noqa: BLE001 - a key that does not load: the table is read as before
            self._stored = None

    def _canonical(self, key: Any) -> Any:
        """``key`` as a scan of the store gives it back (``loads(dumps(key))``): the form the
        filter of stored keys hashes. A key the serde turns into another type (a UUID or a
        date into a string with JSON, an enum into its value) hashes differently; a key of a
        plain type under a built-in serde is itself."""
        if self._plain_keys and type(key) in _PLAIN_TYPES:
            return key
        return self._kloads(self._kdumps(key))

    def _learn(self, stored: StoredKeys, key: Any) -> StoredKeys | None:
        """Add ``key`` to the filter; the filter, or None (and none from now) if the key
        comes back from its serde unhashable (a tuple through JSON comes back a list)."""
        try:
            stored.add(self._canonical(key))
        except TypeError:
            self._stored = None
            return None
        return stored

    def _stored_keys(self) -> Iterator[bytes]:
        return (k for k, _ in self.store.items(self.table))

    def discard(self) -> None:
        """Drop every uncommitted change; the next reads see the store's committed state."""
        cache, stored = self._cache, self._stored
        for k in self._dirty:
            cache.pop(k, None)
            if stored is not None:  # it may hold a committed value
                stored = self._learn(stored, k)
        self._dirty.clear()

    def invalidate(self) -> None:
        """Drop the whole cache, uncommitted changes included. The store was changed by
        something else: its keys are scanned again at the next :meth:`mark_clean`."""
        self._cache.clear()
        self._dirty.clear()
        if self._stored is not None:
            self._stored, self._rescan = None, True

    def release(self) -> None:
        """The table is done with (its store closes): drop the cache, leave the budget."""
        self.invalidate()
        self._rescan = False
        if self.budget is not None:
            self.budget.leave()
            self.budget = None

    # -- iteration ---------------------------------------------------------------

    def items(self) -> Iterator[tuple[Any, Any]]:
        """``(key, value)`` of the merged view (store overlaid with uncommitted
        changes), in the store's key order (ascending serialised key).  The
        uncommitted changes are captured when this is called."""
        kdumps = self._kdumps
        overlay = sorted(((kdumps(k), k, v) for k, v in self._dirty.items()), key=_first)
        return self._merge(overlay, self.store.items(self.table))

    def items_between(self, start: bytes, end: bytes) -> Iterator[tuple[Any, Any]]:
        """:meth:`items` of the serialised keys in ``[start, end)`` only."""
        kdumps = self._kdumps
        overlay = sorted(
            (kb, k, v) for k, v in self._dirty.items() if start <= (kb := kdumps(k)) < end
        )  # fmt: skip
        return self._merge(overlay, self.store.items(self.table, start, end))

    def _merge(
        self, overlay: list[tuple[bytes, Any, Any]], stored: Iterator[tuple[bytes, bytes]]
    ) -> Iterator[tuple[Any, Any]]:
        cache = self._cache
        kloads = self._kloads
        vloads = self._vloads
        i, n = 0, len(overlay)
        for kb, vb in stored:
            while i < n and overlay[i][0] < kb:
                _, k, v = overlay[i]
                i += 1
                if v is not _ABSENT:
                    yield k, v
            if i < n and overlay[i][0] == kb:
                _, k, v = overlay[i]
                i += 1
                if v is not _ABSENT:
                    yield k, v
                continue
            k = kloads(kb)
            try:
                v = cache.get(k, _MISSING)  # a clean cached entry: hand out the same object
            except TypeError:  # unhashable key: cannot be cached anyway
                v = _MISSING
            yield k, (vloads(vb) if v is _MISSING or v is _ABSENT else v)
        for _, k, v in overlay[i:]:
            if v is not _ABSENT:
                yield k, v

    def keys(self) -> Iterator[Any]:
        for k, _ in self.items():
            yield k

    def __repr__(self) -> str:
        return (
            f"<CachedTable {self.table!r} of {self.store.name!r}: {len(self._cache)} cached, {len(self._dirty)} dirty>"
        )


def _first(t: tuple[bytes, Any, Any]) -> bytes:
    return t[0]


def commit_cached(store: Store, tables: Iterable[CachedTable], checkpoint: Checkpoint) -> None:
    """Commit the pending changes of ``tables`` (all on ``store``) with
    ``checkpoint`` in one atomic commit, then mark them clean.  If the commit
    raises, the tables keep their dirty state (see :meth:`CachedTable.discard`)."""
    tables = list(tables)
    changes: dict[str, Mapping[bytes, bytes | None]] = {}
    for t in tables:
        if t.store is not store:
            raise StoreError(f"CachedTable {t.table!r} belongs to store {t.store.name!r}, not {store.name!r}")
        if t.table in changes:
            raise StoreError(f"two CachedTables for table {t.table!r}: their changes would overwrite each other")
        changes[t.table] = t.changes()
    store.commit(changes, checkpoint)
    for t in tables:
        t.mark_clean()
