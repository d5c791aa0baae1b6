"""The garbage collector while a worker runs.

Every record a worker reads is several container objects (the record, its headers, the
decoded value), and CPython's youngest generation is collected after 700 of them: a
collection every hundred records or so, each walking whatever survived the last ones
(fetched batches, open state). Collecting less often, and keeping the objects alive
since start-up out of every collection (``gc.freeze``), is most of what the
collector costs a stream processor. Reference counting still frees almost everything;
only cycles wait longer.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["fewer_collections"]


OLDEST_EVERY = 100
"""Collections of the middle generation between two of the oldest (CPython: 10). A
worker's oldest generation holds its state caches, a million containers at a million
keys, and every update replaces one: with CPython's 10, the whole of it was walked every
few hundred thousand records (9% of a worker's time at a million keys)."""

_holders: list[tuple[int, int, int]] = []  # the thresholds found by the first of nested users


@contextmanager
def fewer_collections(threshold: int | None) -> Iterator[None]:
    """Within: objects alive now are frozen and the youngest generation is collected
    after ``threshold`` allocations (None: change nothing). Several workers in one
    process share it: the last one out restores what the first one found."""
    if threshold is None:
        yield
        return
    before = gc.get_threshold()
    _holders.append(_holders[0] if _holders else before)
    gc.collect()
    gc.freeze()
    gc.set_threshold(max(threshold, before[0]), before[1], max(before[2], OLDEST_EVERY))
    try:
        yield
    finally:
        found = _holders.pop()
        if not _holders:
            gc.set_threshold(*found)
            gc.unfreeze()
