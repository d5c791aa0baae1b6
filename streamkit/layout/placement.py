"""Key -> partition under a layout (KIP-253).

A keyed record goes to ``lh_bucket(key_hash(key), n0, active)``: linear hashing over
the initial count and the active count.  Every result is ``< active``, and by the
layout invariant exactly the partitions ``< active`` are ReadWrite, so a record is
never placed on a ReadOnly or None partition.  With ``active == n0`` this is Kafka's
default partitioner (``murmur2 & 0x7fffffff mod n``), so topics written by other
Kafka clients can be adopted.

A record without a key is spread round-robin over the ReadWrite partitions.  A topic
without a layout uses Kafka's default partitioner over its physical count.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from assignors.linear_hashing import lh_bucket, lh_bucket_batch
from assignors.murmur2 import kafka_partition, key_hash, key_hash_cached
from streamkit.layout.model import PartitionMode, TopicLayout

__all__ = [
    "Placer",
    "default_partition",
    "partition_for_hash",
    "partition_for_key",
    "partitions_for_hashes",
]


def partition_for_hash(layout: TopicLayout, h: int) -> int:
    """The partition of key hash ``h`` (``murmur2 & 0x7fffffff``) under ``layout``."""
    return lh_bucket(h, layout.n0, layout.active)


def partition_for_key(layout: TopicLayout, key: bytes) -> int:
    """The partition of ``key`` under ``layout`` (always a ReadWrite partition)."""
    return lh_bucket(key_hash(key), layout.n0, layout.active)


def partitions_for_hashes(layout: TopicLayout, hashes: np.ndarray) -> np.ndarray:
    """Vectorised :func:`partition_for_hash` (``hashes``: e.g. ``assignors.vectorized`` output)."""
    return lh_bucket_batch(hashes, layout.n0, layout.active)


def default_partition(key: bytes, physical: int) -> int:
    """Kafka's default partitioner, for topics without a layout."""
    return kafka_partition(key, physical)


class Placer:
    """A fast key -> partition function bound to one layout (the producer's hot path).

    ``placer(key_bytes)`` returns the partition; ``placer(None)`` a round-robin
    ReadWrite partition.  Key hashes go through a bounded LRU cache.
    """

    __slots__ = ("layout", "_base", "_mod", "_n", "_rr", "_hash")

    def __init__(self, layout: TopicLayout, *, cache: bool = True) -> None:
        self.layout = layout
        n0, n = layout.n0, layout.active
        self._base = n0 << ((n // n0).bit_length() - 1)
        self._mod = self._base << 1
        self._n = n
        self._rr = itertools.cycle(range(n))
        self._hash: Callable[[Any], int] = key_hash_cached if cache else key_hash
        assert all(layout.mode(p) == PartitionMode.READ_WRITE for p in range(n))

    def __call__(self, key: bytes | None) -> int:
        if key is None:
            return next(self._rr)
        try:
            h = self._hash(key)
        except TypeError:  # unhashable (bytearray, memoryview): no cache
            h = key_hash(bytes(key))
        b = h % self._mod
        return b if b < self._n else b - self._base

    def many(self, keys: Sequence[bytes | None]) -> list[int]:
        return [self(k) for k in keys]
