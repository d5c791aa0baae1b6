"""Which keys a store table may hold: a filter that lets a write-back cache answer "not
in the store" for a key it lacks, without reading the store (``stores.cache``).

At a million keys nearly every record reads a key its processor has never held: the
cache misses, and the store's read of a key it lacks walked RocksDB's memtables and every
level's filter, about 0.9 µs of each record's time, with the interpreter's lock held.
This filter is a bit array in the process, two bits per key from the key's own Python
hash (the cache's keys are deserialised, so the hash is the one the cache's dict uses,
already computed): a probe is two bit tests.

It answers for a table's committed keys: it is built by a scan of the table (at most
``SCAN_LIMIT`` keys; beyond that a table is read as before), and it learns each key the
cache lets go that the store may hold. False positives (about 1.5% with the capacity
doubled at each rebuild) cost a store read, as before; it never says "absent" of a key
the store holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["SCAN_LIMIT", "StoredKeys"]

SCAN_LIMIT = 1_000_000
"""Keys of one table a scan reads at most: a scan is a pause (about half a second at the
limit) and the filter's memory grows with the keys (16 bits each, 2 MiB at the limit)."""

_BITS_PER_KEY = 16
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
        """Keys it takes before its false positives grow past about 1.5%."""

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
    def full(self) -> bool:
        return self._count > self.capacity

    def add(self, key: Any) -> None:
        """Learn ``key`` (counted only if it sets a bit: a key learnt again, as a key the
        cache lets go again and again, does not fill the filter)."""
        h = hash(key)
        mask, bits = self._mask, self._bits
        i, j = h & mask, (h >> 32) & mask
        a, b = bits[i >> 3], bits[j >> 3]
        if not (a >> (i & 7) & 1 and b >> (j & 7) & 1):
            bits[i >> 3] = a | 1 << (i & 7)
            bits[j >> 3] |= 1 << (j & 7)
            self._count += 1

    def may_hold(self, key: Any) -> bool:
        h = hash(key)
        mask, bits = self._mask, self._bits
        i, j = h & mask, (h >> 32) & mask
        return bool(bits[i >> 3] >> (i & 7) & 1 and bits[j >> 3] >> (j & 7) & 1)
