"""Which keys a store table may hold: a filter that lets a write-back cache answer "not
in the store" for a key it lacks, without reading the store (``stores.cache``).

At a million keys nearly every record reads a key its processor has never held: the
cache misses, and the store's read of a key it lacks walked RocksDB's memtables and every
level's filter, about 0.9 µs of each record's time, with the interpreter's lock held.
This filter is a bit array in the process, one bit per key from the Python hash of the
key as a scan of the store gives it back (the cache's keys are deserialised: for a plain
key under a built-in serde that is the key itself, its hash already computed by the
cache's dict; a key the serde turns into another type, as JSON turns a UUID into a
string, is hashed in the form it comes back in): a probe is one bit test. One bit, not two: each probe is a miss of the
CPU's caches, and two cost 300 ns where one costs 180.

It answers for a table's committed keys: it is built by a scan of the table (at most
``SCAN_LIMIT`` keys; beyond that a table is read as before), and it learns each key the
cache lets go that the store may hold. False positives (at most about 3%: 32 bits per
key at capacity) cost a store read, as before; it never says "absent" of a key the store
holds. Keys whose hashes share their low bits (ints that are multiples of a large power
of two) share a bit: slower, still exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["SCAN_LIMIT", "StoredKeys"]

SCAN_LIMIT = 1_000_000
"""Keys of one table a scan reads at most: a scan is a pause (about half a second at the
limit) and the filter's memory grows with the keys (up to 64 bits each with the room a
scan leaves: 8 MiB at the limit)."""

_BITS_PER_KEY = 32
_MIN_BITS = 1 << 16


class StoredKeys:
    """A filter of the keys a table may hold (see the module docstring)."""

    __slots__ = ("_bits", "_mask", "_count", "capacity")

    def __init__(self, capacity: int) -> None:
        size = _MIN_BITS
        while size < capacity * _BITS_PER_KEY:
            size <<= 1
        self._bits = bytearray(size >> 3)
        self._mask = size - 1
        self._count = 0
        self.capacity = size // _BITS_PER_KEY
        """Keys it takes before its false positives grow past about 3%."""

    @classmethod
    def scan(
        cls,
        keys: Callable[[], Iterable[bytes]],
        loads: Callable[[bytes], Any],
        limit: int = SCAN_LIMIT,
        capacity: int = _MIN_BITS // _BITS_PER_KEY,
    ) -> StoredKeys | None:
        """The filter of a table's stored keys (``keys()`` iterates them, ``loads``
        deserialises one), with room for as many again; None if there are more than
        ``limit``. A filter that fills up is built again twice as big (no list of keys
        is held meanwhile): ``capacity``, the keys it should take at first."""
        while True:
            filt = cls(capacity)
            for n, stored in enumerate(keys()):
                if n >= limit:
                    return None
                filt.add(loads(stored))
                if 2 * filt._count > filt.capacity:
                    break
            else:
                return filt
            capacity = 2 * filt.capacity

    @property
    def empty(self) -> bool:
        """It learnt no key: every key the store holds is in the cache."""
        return not self._count

    @property
    def full(self) -> bool:
        return self._count > self.capacity

    def add(self, key: Any) -> None:
        """Learn ``key`` (counted only if it sets its bit: a key learnt again, as a key the
        cache lets go again and again, does not fill the filter)."""
        i = hash(key) & self._mask
        bits, bit = self._bits, 1 << (i & 7)
        byte = bits[i >> 3]
        if not byte & bit:
            bits[i >> 3] = byte | bit
            self._count += 1

    def may_hold(self, key: Any) -> bool:
        i = hash(key) & self._mask
        return bool(self._bits[i >> 3] >> (i & 7) & 1)
