"""Batch murmur2 with numpy: the key hash of many keys at once, bit-for-bit equal to
:func:`assignors.murmur2.key_hash`.

Why: the Spark bridge and backfills place millions of keys (Arrow columns), and the
benchmarks hash hundreds of thousands; the scalar path does at most 1.3M keys/s.

How: the keys are one contiguous byte buffer plus offsets (exactly Arrow's binary
layout; a ``Sequence[bytes]`` is packed into one by pyarrow when it is installed,
else by ``b"".join``).  A uint32 view of that buffer with a stride of ONE byte makes
"the little-endian word starting at byte i" a single fancy-index gather, so the loop
runs over word positions (0, 1, 2, ... up to the longest key's word count), never
over keys.  Where key lengths differ by at most two words, every key is mixed and
the result kept only where the key has that word; deeper raggedness orders keys by
word count, longest first (a linear-time radix argsort), so the keys still having
word j are a prefix and each step works on contiguous slices.  uint32 arithmetic
wraps modulo 2**32 exactly like Java's ``int``.

Results are ``np.uint32`` arrays of ``key_hash`` values (0 .. 2**31-1).  Null keys
(``None`` in a sequence, nulls in an Arrow array) have no hash in Kafka (the Java
client spreads them with its sticky partitioner); they get :data:`NULL_HASH`
(0xFFFFFFFF), which no key can have since real hashes are below 2**31.  Filter them
out (``h != NULL_HASH``) before placing, or pass ``null_hash=None`` to get a
``ValueError`` instead.

Measured on the reference machine (2 cores shared with other jobs, numpy 2.4,
pyarrow 26, 1,000,000 keys, best of 5):

===========================  ==================  ==================
keys                         ``key_hash_arrow``  ``key_hash_batch``
===========================  ==================  ==================
8 bytes, fixed length        26M keys/s          17M keys/s
``b"key-<i>"``, 5-10 bytes   23M keys/s          15M keys/s
random, 4-24 bytes           12M keys/s           9M keys/s
UUID strings, 36 bytes        9M keys/s           7M keys/s
===========================  ==================  ==================

(``key_hash_batch`` packs a list of bytes into Arrow first; the scalar path does
0.4-1.3M keys/s on the same keys.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from assignors.murmur2 import SEED

if TYPE_CHECKING:  # pyarrow is an optional dependency (the "spark" extra)
    import pyarrow as pa

__all__ = ["ARROW_FROM", "NULL_HASH", "key_hash_arrow", "key_hash_batch", "murmur2_offsets"]

NULL_HASH: int = 0xFFFFFFFF
"""Hash reported for a null key: outside the range of every real key hash."""

_M = np.uint32(0x5BD1E995)
_POSITIVE = np.uint32(0x7FFFFFFF)
_MASKED_STEPS = 2  # ragged word steps done by masking rather than by sorting keys
_SLACK = 4 + 4 * _MASKED_STEPS  # bytes a word gather may read past a key's end
_TAIL_MASKS = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF], dtype=np.uint32)

U32Array = npt.NDArray[np.uint32]


def _word_view(buf: npt.NDArray[np.uint8]) -> U32Array:
    """uint32 view of ``buf`` where element i is the little-endian word at byte i."""
    return np.ndarray(shape=(buf.size - 3,), dtype="<u4", buffer=buf, offset=0, strides=(1,))


def murmur2_offsets(data: npt.NDArray[np.uint8], offsets: npt.NDArray[np.integer[Any]]) -> U32Array:
    """Unsigned 32-bit murmur2 of each key ``data[offsets[i]:offsets[i+1]]``.

    The full 32-bit hash (``key_hash`` is this & 0x7fffffff).  Word gathers read up to
    :data:`_SLACK` bytes past a key's end; keys that close to the end of ``data`` are
    hashed from a small padded copy, so ``data`` needs no padding.
    """
    offs: npt.NDArray[np.int64] = np.asarray(offsets, dtype=np.int64)
    count = offs.size - 1
    if count <= 0:
        return np.empty(0, dtype=np.uint32)
    # Keys [0, k) can be read in place; [k, count) need a padded copy (a few keys).
    k = int(np.searchsorted(offs[1:], data.size - _SLACK, side="right"))
    if k == count:
        return _murmur2_padded(data, offs)
    first = int(offs[k])
    tail = np.zeros(int(offs[-1]) - first + _SLACK, dtype=np.uint8)
    tail[: tail.size - _SLACK] = data[first : int(offs[-1])]
    rest = _murmur2_padded(tail, offs[k:] - first)
    if k == 0:
        return rest
    return np.concatenate([_murmur2_padded(data, offs[: k + 1]), rest])


def _murmur2_padded(data: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64]) -> U32Array:
    """:func:`murmur2_offsets` for ``data`` extending ``_SLACK`` bytes past the last key."""
    words = _word_view(data)
    starts = offsets[:-1]
    ends = offsets[1:]
    lengths = ends - starts
    n4 = lengths >> 2
    h = np.uint32(SEED) ^ lengths.astype(np.uint32)
    lo = int(n4.min())
    hi = int(n4.max())
    # Words every key has: whole-array steps.
    for j in range(lo):
        _mix(h, words[starts + 4 * j])
    if 0 < hi - lo <= _MASKED_STEPS:
        # Shallow raggedness (typical: lengths within a few bytes of each other):
        # mix every key and keep the result only where the key has word j.  Reads of
        # shorter keys overrun their end by at most 4*_MASKED_STEPS bytes (< _SLACK).
        for j in range(lo, hi):
            mixed = h.copy()
            _mix(mixed, words[starts + 4 * j])
            np.copyto(h, mixed, where=n4 > j)
    elif hi > lo:
        # Deep raggedness: order keys by word count, longest first, so that the keys
        # having word j are a prefix.  Stable radix argsort on small integers.
        key = (hi - n4).astype(np.uint16 if hi - lo < 1 << 16 else np.int64)
        order = np.argsort(key, kind="stable")
        hs = h[order]
        ss = starts[order]
        # active[j - lo] = number of keys with more than j words
        active = np.searchsorted(-n4[order], -np.arange(lo + 1, hi + 1), side="right")
        for j in range(lo, hi):
            c = int(active[j - lo])
            _mix(hs[:c], words[ss[:c] + 4 * j])
        h[order] = hs
    rem = lengths & 3
    tail = words[ends - rem] & _TAIL_MASKS[rem]
    h = np.where(rem != 0, (h ^ tail) * _M, h)
    h ^= h >> np.uint32(13)
    h *= _M
    h ^= h >> np.uint32(15)
    return h


def _mix(h: U32Array, k: U32Array) -> None:
    """One murmur2 round in place: ``k *= m; k ^= k >>> 24; k *= m; h *= m; h ^= k``."""
    k *= _M
    k ^= k >> np.uint32(24)
    k *= _M
    h *= _M
    h ^= k


def key_hash_batch(keys: Sequence[bytes | None], *, null_hash: int | None = NULL_HASH) -> U32Array:
    """``key_hash`` of every key, as a ``np.uint32`` array (same order as ``keys``).

    Keys are bytes-like (``bytes``, ``bytearray``, ``memoryview``).  ``None`` keys get
    ``null_hash`` (default :data:`NULL_HASH`), or raise ``ValueError`` when
    ``null_hash`` is None.  From ``ARROW_FROM`` keys, with pyarrow installed, the keys
    are packed by Arrow's C++ converter (4x faster than ``b"".join`` plus ``len`` of
    each key at a million keys); otherwise by ``b"".join``.
    """
    if len(keys) == 0:
        return np.empty(0, dtype=np.uint32)
    if len(keys) < ARROW_FROM:
        return _key_hash_joined(keys, null_hash)
    try:
        import pyarrow as pa
    except ImportError:  # pragma: no cover - pyarrow is installed in the dev venv
        return _key_hash_joined(keys, null_hash)
    try:
        array = pa.array(keys, type=pa.large_binary())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return _key_hash_joined(keys, null_hash)  # e.g. exotic buffer objects
    return key_hash_arrow(array, null_hash=null_hash)


ARROW_FROM = 1 << 16
"""Keys from which Arrow's converter packs them (4x faster than ``b"".join`` at a
million keys). Below, ``b"".join`` is as fast (98 against 95 ns a key at 2,000 keys:
murmur2 dominates), and a worker hashing a plain producer's batches never converts with
pyarrow, whose first conversion imports pandas (half a second of CPU)."""


def _key_hash_joined(keys: Sequence[bytes | None], null_hash: int | None) -> U32Array:
    """:func:`key_hash_batch` without pyarrow: one ``b"".join`` of the keys."""
    count = len(keys)
    nulls: npt.NDArray[np.bool_] | None = None
    try:
        joined = b"".join(keys)  # type: ignore[arg-type]
    except TypeError:
        nulls = np.fromiter((k is None for k in keys), dtype=bool, count=count)
        if not nulls.any():
            raise  # not bytes-like, and not None either
        keys = [b"" if k is None else k for k in keys]
        joined = b"".join(keys)  # type: ignore[arg-type]
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=count)  # type: ignore[arg-type]
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    h = murmur2_offsets(np.frombuffer(joined, dtype=np.uint8), offsets) & _POSITIVE
    return _apply_nulls(h, nulls, null_hash)


def _apply_nulls(h: U32Array, nulls: npt.NDArray[np.bool_] | None, null_hash: int | None) -> U32Array:
    """Overwrite the hashes of null keys with ``null_hash`` (or refuse nulls)."""
    if nulls is not None and nulls.any():
        if null_hash is None:
            raise ValueError("null keys have no hash (null_hash=None)")
        h[nulls] = np.uint32(null_hash)
    return h


def key_hash_arrow(array: pa.Array | pa.ChunkedArray, *, null_hash: int | None = NULL_HASH) -> U32Array:
    """``key_hash`` of every element of a pyarrow binary / large_binary / string /
    large_string (or binary_view / string_view) array or chunked array, as a
    ``np.uint32`` array.

    Reads the Arrow offsets and data buffers in place (zero-copy; views are cast to
    large_binary first).  Strings hash as their UTF-8 bytes, like
    ``key_hash(s.encode())``.  Nulls get ``null_hash`` (see the module docstring).
    """
    import pyarrow as pa

    if isinstance(array, pa.ChunkedArray):
        parts = [key_hash_arrow(c, null_hash=null_hash) for c in array.chunks]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint32)
    t = array.type
    if pa.types.is_binary_view(t) or pa.types.is_string_view(t):
        array = array.cast(pa.large_binary())
        t = array.type
    off_dtype: type[np.integer[Any]]
    if pa.types.is_binary(t) or pa.types.is_string(t):
        off_dtype = np.int32
    elif pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        off_dtype = np.int64
    else:
        raise TypeError(f"expected a binary or string array, got {t}")
    count = len(array)
    if count == 0:
        return np.empty(0, dtype=np.uint32)
    _validity, off_buf, data_buf = array.buffers()
    offsets = np.frombuffer(off_buf, dtype=off_dtype, count=array.offset + count + 1)[array.offset :].astype(np.int64)
    if data_buf is None:
        data = np.zeros(0, dtype=np.uint8)
    else:
        data = np.frombuffer(data_buf, dtype=np.uint8)
    h = murmur2_offsets(data, offsets) & _POSITIVE
    nulls = None
    if array.null_count:
        nulls = array.is_null().to_numpy(zero_copy_only=False)
    return _apply_nulls(h, nulls, null_hash)
