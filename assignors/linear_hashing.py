"""Linear hashing (KIP-253, Proposed Change 5): key -> partition over a growing or
shrinking partition count, and the blockers that keep each key's records in order.

Definition (docs/design.md): with ``n0`` the initial count and ``n`` the current one,
``L`` is the largest level with ``n0 * 2**L <= n``, the base is ``B = n0 * 2**L`` and
the split pointer ``S = n - B``.  A hash goes to ``b = h mod B``, or to
``h mod 2B`` when ``b < S``.  Equivalently (and how it is computed here): with
``b = h mod 2B``, the bucket is ``b`` if ``b < n`` else ``b - B``.

Why linear hashing: growing ``n`` to ``n + 1`` splits exactly one bucket (the split
pointer ``S``) into ``S`` and ``B + S``; every other key stays put.  Hence:

- each bucket is one residue class ``h mod M`` (``M`` = ``B`` or ``2B``), and the
  buckets at a larger count refine the buckets at a smaller one;
- partition ``p >= n0`` was created by splitting ``parent(p) = p - n0 * 2**floor(log2(p/n0))``,
  independent of later history: the splits form a fixed tree rooted at ``0 .. n0-1``;
- a new partition is blocked by exactly one existing partition (its nearest ancestor
  that existed), and keys never move between two partitions that both exist before
  and after a change (KIP-253: "no movement of keys between existing partitions");
- a deleted partition's keys all land on exactly one surviving partition, its
  nearest surviving ancestor, found in at most ``log2(n/n0) + 1`` parent steps.

With ``n == n0`` this is ``h mod n``: Kafka's default partitioner.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from assignors.murmur2 import Bytes, key_hash

__all__ = [
    "lh_params",
    "lh_base",
    "lh_bucket",
    "lh_bucket_batch",
    "bucket_modulus",
    "partition_for_key",
    "parent",
    "ancestors",
    "nearest_ancestor_below",
    "expansion_blockers",
    "deletion_blockers",
    "key_sources",
]


def _check_counts(n0: int, n: int, what: str = "n") -> None:
    """Validate an initial count and a current count."""
    if n0 < 1:
        raise ValueError(f"initial count n0 must be >= 1, got {n0}")
    if n < n0:
        raise ValueError(f"{what} must be >= the initial count n0={n0}, got {n}")


def lh_params(n0: int, n: int) -> tuple[int, int]:
    """``(level, split)``: the largest ``L`` with ``n0 * 2**L <= n``, and ``n - n0 * 2**L``."""
    _check_counts(n0, n)
    level = (n // n0).bit_length() - 1
    return level, n - (n0 << level)


def lh_base(n0: int, n: int) -> int:
    """The base ``B = n0 * 2**L`` of count ``n`` (buckets use modulus ``B`` or ``2B``)."""
    level, _ = lh_params(n0, n)
    return n0 << level


def lh_bucket(h: int, n0: int, n: int) -> int:
    """The bucket (partition or processor) of hash ``h >= 0`` at count ``n``."""
    _check_counts(n0, n)
    base = n0 << ((n // n0).bit_length() - 1)
    b = h % (base << 1)
    return b if b < n else b - base


def lh_bucket_batch(h: npt.NDArray[np.integer[Any]], n0: int, n: int) -> npt.NDArray[np.integer[Any]]:
    """:func:`lh_bucket` of every hash in ``h`` (non-negative integers, e.g. the
    ``np.uint32`` output of :mod:`assignors.vectorized`).

    Returns an array of the same integer dtype as ``h``: one modulo, one compare and
    one subtraction per element.
    """
    _check_counts(n0, n)
    h = np.asarray(h)
    base = n0 << ((n // n0).bit_length() - 1)
    b = h % h.dtype.type(base << 1)
    b -= (b >= n).astype(b.dtype) * h.dtype.type(base)
    return b


def bucket_modulus(b: int, n0: int, n: int) -> int:
    """The modulus ``M`` of bucket ``b`` at count ``n``: its hashes are ``h ≡ b (mod M)``.

    ``M = 2B`` for buckets already split in the current round (``b < S``) and for
    the buckets they split into (``b >= B``); ``M = B`` for the others.
    """
    level, split = lh_params(n0, n)
    if not 0 <= b < n:
        raise ValueError(f"bucket {b} out of range(0, {n})")
    base = n0 << level
    return base << 1 if (b < split or b >= base) else base


def partition_for_key(key: Bytes, n0: int, n: int) -> int:
    """The partition of ``key`` in a topic created with ``n0`` partitions, now ``n``."""
    return lh_bucket(key_hash(key), n0, n)


def parent(p: int, n0: int) -> int | None:
    """The partition that ``p`` was split from (None for an initial partition ``p < n0``).

    Partition ``p >= n0`` is created when the count grows from ``p`` to ``p + 1``: the
    split pointer then is ``p - B`` with ``B = n0 * 2**floor(log2(p / n0))``.
    """
    if n0 < 1:
        raise ValueError(f"initial count n0 must be >= 1, got {n0}")
    if p < 0:
        raise ValueError(f"partition must be >= 0, got {p}")
    if p < n0:
        return None
    return p - (n0 << ((p // n0).bit_length() - 1))


def ancestors(p: int, n0: int) -> list[int]:
    """``parent(p)``, its parent, ... down to an initial partition (nearest first).

    At most ``floor(log2(p / n0)) + 1`` entries, since each step at least halves
    ``p // n0``.
    """
    chain: list[int] = []
    q = parent(p, n0)
    while q is not None:
        chain.append(q)
        q = parent(q, n0)
    return chain


def nearest_ancestor_below(p: int, n0: int, limit: int) -> int:
    """``p`` itself if ``p < limit``, else its nearest ancestor ``< limit``.

    That is the bucket at count ``limit`` (``n0 <= limit``) holding all keys of
    bucket ``p`` at any larger count: buckets at a larger count refine those at a
    smaller one, and a bucket's keys came from its parent.
    """
    if limit < n0:
        raise ValueError(f"limit must be >= n0={n0}, got {limit}")
    while p >= limit:
        p = p - (n0 << ((p // n0).bit_length() - 1))
    return p


def expansion_blockers(n0: int, old_n: int, new_n: int) -> dict[int, int]:
    """For growth from ``old_n`` to ``new_n`` partitions: ``{new_partition: blocker}``.

    The keys of each new partition were, under ``old_n``, all in exactly one existing
    partition (its nearest ancestor below ``old_n``); the new partition may be consumed
    only once the group has passed that partition's last old-layout record (KIP-253
    Proposed Change 8, step 4.2).  When ``new_n > 2 * old_n`` the direct parent of a
    new partition may itself be new; the blocker is then the nearest older ancestor.
    """
    _check_counts(n0, old_n, "old_n")
    if new_n < old_n:
        raise ValueError(f"expansion needs new_n >= old_n, got {old_n} -> {new_n}")
    return {p: nearest_ancestor_below(p, n0, old_n) for p in range(old_n, new_n)}


def deletion_blockers(n0: int, old_n: int, new_n: int) -> dict[int, set[int]]:
    """For shrinking from ``old_n`` to ``new_n >= n0`` partitions:
    ``{surviving_partition: {deleted partitions whose keys now land on it}}``.

    A surviving partition must not deliver records past its deletion seal until the
    group has drained these deleted partitions (KIP-253 Proposed Change 8, step 5).
    Only surviving partitions that are blocked appear (use ``.get(p, set())``).

    Each deleted partition blocks exactly one survivor, found by walking at most
    ``log2(old_n / n0) + 1`` parents: O(log n) per deleted partition, which is the
    KIP's bound.  The number of deleted partitions blocking ONE survivor is the
    number of deleted buckets its keys were spread over: at most
    ``2 * lh_base(n0, old_n) // bucket_modulus(p, n0, new_n) - 1``, so at most 3 when
    ``old_n <= 2 * new_n`` (within ``ceil(log2(old_n)) + 1`` for ``old_n >= 2``), but
    about ``2 * old_n / new_n`` for deep shrinks (e.g. ``n0=1``, 64 -> 1: partition 0
    waits for all 63 others, since all their keys now land on it).  Shrink in steps of
    at most half to keep every fan-in at 3 or less.
    """
    _check_counts(n0, new_n, "new_n")
    if old_n < new_n:
        raise ValueError(f"deletion needs new_n <= old_n, got {old_n} -> {new_n}")
    result: dict[int, set[int]] = {}
    for d in range(new_n, old_n):
        result.setdefault(nearest_ancestor_below(d, n0, new_n), set()).add(d)
    return result


def key_sources(p: int, n0: int, n: int, *, high_water: int | None = None) -> set[int]:
    """Partitions that may hold records of keys that map to ``p`` at count ``n``.

    Over the growth history ``n0 .. n`` these are ``p`` and its ancestors (a key of
    ``p`` lived in an ancestor before ``p`` was split off).  This is S2 (docs/design.md)
    for one partition.  If the topic was ever larger than ``n`` (shrunk since),
    pass ``high_water`` = the largest count it had: deleted partitions below it whose
    keys now land on ``p`` are added (they may still hold undrained records).
    """
    _check_counts(n0, n)
    if not 0 <= p < n:
        raise ValueError(f"partition {p} out of range(0, {n})")
    sources = {p, *ancestors(p, n0)}
    if high_water is not None:
        if high_water < n:
            raise ValueError(f"high_water must be >= n={n}, got {high_water}")
        sources.update(deletion_blockers(n0, high_water, n).get(p, ()))
    return sources
