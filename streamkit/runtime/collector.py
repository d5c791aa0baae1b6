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
freezes them instead; so that cycles which became garbage among frozen objects are not
kept for ever, it thaws everything every ``THAW_EVERY`` seconds and collects it once.
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
"""Seconds between two whole collections of what :func:`settle` froze. One walks every
object alive: about 25 ms at a million keys, once a minute, inside a checkpoint."""

_holders: list[tuple[int, int, int]] = []  # the thresholds found by the first of nested users
_thawed_at: list[float] = []  # when settle last collected everything (one per outermost user)


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
    if not _thawed_at:
        _thawed_at.append(time.monotonic())
    gc.set_threshold(max(threshold, before[0]), before[1], max(before[2], OLDEST_EVERY))
    try:
        yield
    finally:
        found = _holders.pop()
        if not _holders:
            gc.set_threshold(*found)
            gc.unfreeze()
            _thawed_at.clear()


def settle(now: float | None = None) -> int | None:
    """After a checkpoint, within :func:`fewer_collections` (else nothing): freeze every
    object alive; every ``THAW_EVERY`` seconds, first thaw and collect them all. Returns
    what that collection found unreachable, or None when it did not run."""
    if not _holders:
        return None
    now = time.monotonic() if now is None else now
    found = None
    if now - _thawed_at[0] >= THAW_EVERY:
        gc.unfreeze()
        found = gc.collect()
        _thawed_at[0] = now
    gc.freeze()
    return found
