"""Key -> processor placement over Arrow columns, equal to the runtime's scalar path.

The runtime places a key on processor ``lh_bucket(key_hash(key_bytes), p0, p)``
(murmur2 & 0x7fffffff, then linear hashing over the job's initial processor count).
Here the same two functions run vectorised: :func:`assignors.vectorized.key_hash_arrow`
reads the Arrow buffers in place and :func:`assignors.linear_hashing.lh_bucket_batch`
does one modulo and one compare per key. The test suite checks bit-for-bit equality
with :func:`processor_of` on random and adversarial keys.

Besides the processor, the backfill splits each processor's keys into ``subs``
sub-buckets so that a processor with many keys is written by several Spark tasks in
parallel (one SST file per sub-bucket; the files of one store have disjoint keys).
The sub-bucket uses hash bits that linear hashing does not look at (the high bits),
so it is spread evenly whatever the processor count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from assignors.linear_hashing import lh_bucket, lh_bucket_batch
from assignors.murmur2 import key_hash
from assignors.vectorized import NULL_HASH, key_hash_arrow

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["NULL_HASH", "bucket_of", "buckets_of", "hashes_of", "processor_of", "processors_of", "sub_of"]

_SUB_SHIFT = 17  # sub-bucket = (h >> 17) % subs: bits 17..30, unused by lh_bucket for p < 2**17


def processor_of(key: bytes, p0: int, p: int) -> int:
    """The scalar path: the processor the runtime places ``key`` (as bytes) on."""
    return lh_bucket(key_hash(key), p0, p)


def sub_of(h: int, subs: int) -> int:
    """Scalar sub-bucket of hash ``h``."""
    return (h >> _SUB_SHIFT) % subs


def hashes_of(keys: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.uint32]:
    """``key_hash`` of every key of a binary/string Arrow array; nulls get ``NULL_HASH``."""
    return key_hash_arrow(keys)


def processors_of(keys: pa.Array | pa.ChunkedArray, p0: int, p: int) -> npt.NDArray[np.int32]:
    """Vectorised :func:`processor_of` (keys must not be null)."""
    h = key_hash_arrow(keys, null_hash=None)
    return lh_bucket_batch(h, p0, p).astype(np.int32, copy=False)


def buckets_of(
    h: npt.NDArray[np.uint32], p0: int, p: int, subs: int
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """(processor, bucket) of every hash; bucket = processor * subs + sub-bucket."""
    proc = lh_bucket_batch(h, p0, p).astype(np.int32, copy=False)
    if subs == 1:
        return proc, proc
    sub = ((h >> np.uint32(_SUB_SHIFT)) % np.uint32(subs)).astype(np.int32, copy=False)
    return proc, proc * np.int32(subs) + sub


def bucket_of(key: bytes, p0: int, p: int, subs: int) -> int:
    """Scalar form of :func:`buckets_of` (for tests and the single-process path)."""
    h = key_hash(key)
    return lh_bucket(h, p0, p) * subs + sub_of(h, subs)
