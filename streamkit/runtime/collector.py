"""The garbage collector while a worker runs.

Every record a worker reads is several container objects (the record, its headers, the
decoded value), and CPython's youngest generation is collected after 700 of them: a
collection every hundred records or so, each walking whatever survived the last ones
(fetched batches, open state). Collecting less often, and keeping the objects alive
since start-up out of every collection (``gc.freeze``), is most of what the
collector costs a stream processor. Reference counting still frees almost everything;
only cycles wait longer.

What is alive at a checkpoint is, for the most part, the state caches' values: they stay
until they are replaced or evicted. Each new value was still walked twice (by the young
collection after it was made, and by the middle one), 7% of a worker's time at a million
keys, where nearly every record leaves one. :func:`settle`, called after each checkpoint,
freezes them instead. Cycles that became garbage among frozen objects would be kept for
ever, so when the frozen objects have grown by a quarter since the last whole collection
(CPython's own rule for its oldest generation), and a minute has passed, it thaws
everything and collects it once. A worker whose caches are full and that leaves no cyclic
garbage does not grow, so it never pays for that collection (80 ms at a million values).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["fewer_collections", "settle"]


OLDEST_EVERY = 100
"""Collections of the middle generation between two of the oldest (CPython: 10). A
worker's oldest generation holds its state caches, a million containers at a million
keys, and every update replaces one: with CPython's 10, the whole of it was walked every
few hundred thousand records (9% of a worker's time at a million keys)."""

THAW_EVERY = 60.0
"""Seconds between two whole collections of what :func:`settle` froze, at least."""

THAW_GROWTH = 1.25
"""A whole collection once the frozen objects are this many times as many as after the last."""

_holders: list[tuple[int, int, int]] = []  # the thresholds found by the first of nested users
_thawed: list[tuple[float, int]] = []  # (when, objects frozen) after the last whole collection


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
    if not _thawed:
        _thawed.append((time.monotonic(), gc.get_freeze_count()))
    gc.set_threshold(max(threshold, before[0]), before[1], max(before[2], OLDEST_EVERY))
    try:
        yield
    finally:
        found = _holders.pop()
        if not _holders:
            gc.set_threshold(*found)
            gc.unfreeze()
            _thawed.clear()


def settle(now: float | None = None) -> int | None:
    """After a checkpoint, within :func:`fewer_collections` (else nothing): freeze every
    object alive, after a whole collection when they have grown enough (module doc).
    Returns what that collection found unreachable, or None when it did not run."""
    if not _holders:
        return None
    now = time.monotonic() if now is None else now
    gc.freeze()
    at, frozen = _thawed[0]
    if now - at < THAW_EVERY or gc.get_freeze_count() <= THAW_GROWTH * frozen:
        return None
    gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    _thawed[0] = (now, gc.get_freeze_count())
    return found
