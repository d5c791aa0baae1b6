"""assignors.vectorized: batch murmur2 equals the scalar key_hash bit for bit."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assignors.murmur2 import key_hash
from assignors.vectorized import (
    NULL_HASH,
    _key_hash_joined,
    key_hash_arrow,
    key_hash_batch,
    murmur2_offsets,
)


def scalar(keys: list[bytes]) -> np.ndarray:
    return np.array([key_hash(k) for k in keys], dtype=np.uint32)


EDGE_KEYS: list[bytes] = [
    b"",
    b"a",  # 1-byte tail
    b"ab",  # 2-byte tail
    b"abc",  # 3-byte tail
    b"abcd",  # no tail
    b"abcde",
    "é".encode(),
    "日本語のキー".encode(),
    "🔑-emoji".encode(),
    b"\x00",
    b"\x00\x00\x00\x00\x00",
    b"\xff" * 7,
    bytes(range(256)),
    b"x" * 1000,
    b"y" * 4099,
    b"21",
    b"foobar",
]


def test_edge_cases_batch_and_arrow() -> None:
    expected = scalar(EDGE_KEYS)
    got = key_hash_batch(EDGE_KEYS)
    assert got.dtype == np.uint32
    assert np.array_equal(got, expected)
    assert np.array_equal(_key_hash_joined(EDGE_KEYS, NULL_HASH), expected)
    for t in (pa.binary(), pa.large_binary(), pa.binary_view()):
        assert np.array_equal(key_hash_arrow(pa.array(EDGE_KEYS, type=t)), expected)


def test_every_length_and_alignment() -> None:
    data = bytes(random.Random(7).randrange(256) for _ in range(600))
    keys = [data[i : i + length] for length in range(0, 70) for i in range(0, 5)]
    keys += [data[:length] for length in range(70, 600, 37)]
    expected = scalar(keys)
    assert np.array_equal(key_hash_batch(keys), expected)
    assert np.array_equal(_key_hash_joined(keys, NULL_HASH), expected)
    random.Random(3).shuffle(keys)
    assert np.array_equal(key_hash_batch(keys), scalar(keys))


key_lists = st.lists(st.binary(max_size=64), max_size=200) | st.lists(
    st.binary(min_size=5, max_size=12),
    max_size=200,  # shallow raggedness path
)


@settings(max_examples=150, deadline=None)
@given(key_lists)
def test_batch_equals_scalar(keys: list[bytes]) -> None:
    expected = scalar(keys)
    assert np.array_equal(key_hash_batch(keys), expected)
    assert np.array_equal(_key_hash_joined(keys, NULL_HASH), expected)
    assert np.array_equal(key_hash_arrow(pa.array(keys, type=pa.binary())), expected)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=20), max_size=100), st.data())
def test_arrow_strings_sliced_and_chunked(texts: list[str], data: st.DataObject) -> None:
    expected = scalar([t.encode() for t in texts])
    for t in (pa.string(), pa.large_string(), pa.string_view()):
        arr = pa.array(texts, type=t)
        assert np.array_equal(key_hash_arrow(arr), expected)
        start = data.draw(st.integers(0, len(texts)))
        stop = data.draw(st.integers(start, len(texts)))
        assert np.array_equal(key_hash_arrow(arr.slice(start, stop - start)), expected[start:stop])
        chunked = pa.chunked_array([arr.slice(0, start), arr.slice(start)], type=t)
        assert np.array_equal(key_hash_arrow(chunked), expected)


def test_slices_near_the_end_of_the_buffer() -> None:
    # Keys whose word reads would run past the data buffer are hashed from a padded copy.
    keys = [b"k" * (i % 23) for i in range(300)]
    arr = pa.array(keys, type=pa.binary())
    expected = scalar(keys)
    for start in range(0, 300, 7):
        for stop in (start, start + 1, 299, 300):
            got = key_hash_arrow(arr.slice(start, max(0, stop - start)))
            assert np.array_equal(got, expected[start:stop])


def test_nulls() -> None:
    keys = [b"a", None, b"", None, "é".encode()]
    expected = np.array([key_hash(b"a"), NULL_HASH, key_hash(b""), NULL_HASH, key_hash("é".encode())], dtype=np.uint32)
    assert np.array_equal(key_hash_batch(keys), expected)
    assert np.array_equal(_key_hash_joined(keys, NULL_HASH), expected)
    assert np.array_equal(key_hash_arrow(pa.array(keys, type=pa.binary())), expected)
    assert np.array_equal(key_hash_arrow(pa.array(["a", None, "", None, "é"], type=pa.large_string())), expected)
    assert NULL_HASH > 0x7FFFFFFF  # never a real key hash
    assert key_hash_batch([None, b"x"], null_hash=7)[0] == 7
    with pytest.raises(ValueError, match="null"):
        key_hash_batch([b"a", None], null_hash=None)
    with pytest.raises(ValueError, match="null"):
        _key_hash_joined([b"a", None], None)
    with pytest.raises(ValueError, match="null"):
        key_hash_arrow(pa.array([b"a", None]), null_hash=None)


def test_empty_inputs_and_all_empty_keys() -> None:
    assert key_hash_batch([]).shape == (0,)
    assert key_hash_arrow(pa.array([], type=pa.binary())).shape == (0,)
    assert key_hash_arrow(pa.chunked_array([], type=pa.binary())).shape == (0,)
    assert np.array_equal(key_hash_batch([b""] * 5), scalar([b""] * 5))
    assert np.array_equal(key_hash_arrow(pa.array([""] * 3)), scalar([b""] * 3))


def test_rejects_non_binary() -> None:
    with pytest.raises(TypeError):
        key_hash_arrow(pa.array([1, 2, 3]))
    with pytest.raises(TypeError):
        _key_hash_joined([b"a", 3], NULL_HASH)  # type: ignore[list-item]


def test_murmur2_offsets_full_32_bits() -> None:
    keys = [b"kafka", b"", b"giberish123456789"]
    data = np.frombuffer(b"".join(keys), dtype=np.uint8)
    offsets = np.array([0, 5, 5, 22])
    assert murmur2_offsets(data, offsets).tolist() == [0xD067CF64, 0x106E08D9, 0x8F552B0C]


def test_large_random_batch() -> None:
    rng = np.random.default_rng(11)
    lengths = rng.integers(0, 40, size=20_000)
    blob = rng.integers(0, 256, size=int(lengths.sum()), dtype=np.uint8).tobytes()
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    keys = [blob[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
    assert np.array_equal(key_hash_batch(keys), scalar(keys))


def test_a_batch_of_arrow_size_is_packed_by_arrow_and_equals_scalar() -> None:
    from assignors.vectorized import ARROW_FROM

    keys = [b"key-%d" % i for i in range(ARROW_FROM)]
    assert np.array_equal(key_hash_batch(keys), scalar(keys))


def test_a_workers_batches_never_import_pandas() -> None:
    """A worker hashes a plain producer's batches (a few thousand keys at most): packed by
    ``b"".join``, never by pyarrow, whose first conversion imports pandas."""
    import subprocess
    import sys

    code = (
        "import sys; from assignors.vectorized import key_hash_batch; "
        "key_hash_batch([b'key-%d' % i for i in range(5000)]); "
        "print('pandas' in sys.modules, 'pyarrow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"], out
