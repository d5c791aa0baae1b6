"""The byte bound of the write-back caches (``stores.cache``): a :class:`CacheBudget`.

With a :class:`CacheBudget` the limit of a :class:`stores.cache.CachedTable` is also in
bytes: the budget's bytes are shared equally by the tables that joined it (every table of
every processor a worker hosts), and each table turns its share into an entry count with
its own estimate of an entry's size, refreshed at each ``CachedTable.mark_clean`` from a
sample of the entries just written (``sys.getsizeof`` through lists, tuples, dicts and sets, plus a
dict slot).  Memory then depends on the budget, not on how many keys the job has.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["ENTRY_OVERHEAD", "SAMPLE", "CacheBudget", "deep_size"]

ENTRY_OVERHEAD = 100
"""Bytes of a cache entry beside its key and value objects: the dict's slot and index."""
SAMPLE = 32
"""Entries sampled at each checkpoint to estimate an entry's size."""


class CacheBudget:
    """Bytes shared by the write-back caches of a process, in equal shares."""

    def __init__(self, total_bytes: int) -> None:
        if total_bytes <= 0:
            raise ValueError(f"a cache budget must be positive, got {total_bytes}")
        self.total_bytes = total_bytes
        self.members = 0

    def join(self) -> None:
        self.members += 1

    def leave(self) -> None:
        self.members = max(0, self.members - 1)

    @property
    def share(self) -> int:
        return self.total_bytes // max(1, self.members)


def deep_size(value: Any, depth: int = 3) -> int:
    """Bytes of ``value`` and what it holds (lists, tuples, dicts, sets; ``depth`` levels)."""
    size = sys.getsizeof(value)
    if depth and isinstance(value, (list, tuple, set, frozenset)):
        size += sum(deep_size(v, depth - 1) for v in value)
    elif depth and isinstance(value, dict):
        size += sum(deep_size(k, depth - 1) + deep_size(v, depth - 1) for k, v in value.items())
    return size
