"""Placement and encoding over Arrow equal the runtime's scalar path, bit for bit (no JVM)."""

from __future__ import annotations

import random

import numpy as np
import orjson
import pyarrow as pa
import pytest

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from stores.serde import IntSerde, JsonSerde, RawSerde, StrSerde
from streamkit.spark.backfill import parse_positions
from streamkit.spark.encoding import EncodeError, encode_array
from streamkit.spark.placement import bucket_of, buckets_of, hashes_of, processor_of, processors_of
from streamkit.spark.shuffle import _murmur3_int, spark_partition_keys


def _random_keys(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    keys = [b"", b"\x00", b"\xff" * 9, "ключ-ü".encode()]
    for _ in range(n):
        length = rng.choice([1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 36, 64, 200])
        keys.append(bytes(rng.getrandbits(8) for _ in range(length)))
    return keys


@pytest.mark.parametrize(("p0", "p"), [(1, 1), (3, 3), (3, 5), (4, 7), (2, 8), (5, 16)])
def test_vectorised_processor_equals_scalar(p0: int, p: int) -> None:
    keys = _random_keys(3000, seed=p0 * 100 + p)
    for arr in (pa.array(keys, pa.binary()), pa.array(keys, pa.large_binary())):
        got = processors_of(arr, p0, p)
        want = [lh_bucket(key_hash(k), p0, p) for k in keys]
        assert got.tolist() == want
        assert [processor_of(k, p0, p) for k in keys] == want
    # Arrow slices (non-zero offset) and chunked arrays read the right bytes
    arr = pa.array(keys, pa.binary())
    assert processors_of(arr.slice(5, 100), p0, p).tolist() == want[5:105]
    chunked = pa.chunked_array([arr.slice(0, 10), arr.slice(10)])
    assert processors_of(chunked, p0, p).tolist() == want


def test_strings_hash_as_utf8_and_buckets_match_scalar() -> None:
    words = ["", "a", "user-1", "ключ", "日本語のキー", "x" * 100]
    assert hashes_of(pa.array(words)).tolist() == [key_hash(w.encode()) for w in words]
    keys = _random_keys(2000, seed=7)
    h = hashes_of(pa.array(keys, pa.binary()))
    for subs in (1, 2, 3, 8):
        proc, bucket = buckets_of(h, 3, 5, subs)
        assert bucket.tolist() == [bucket_of(k, 3, 5, subs) for k in keys]
        assert (bucket // subs).tolist() == proc.tolist()
    _, b = buckets_of(h, 2, 2, 4)
    assert set(b.tolist()) == set(range(8))  # every sub-bucket is used


def test_encoding_fast_paths_equal_the_serdes() -> None:
    strs = ["a", "", "ключ", "user-42"]
    assert encode_array(StrSerde(), pa.array(strs), what="k").to_pylist() == [StrSerde().dumps(s) for s in strs]
    raw = [b"\x00\x01", b"", b"\xff"]
    assert encode_array(RawSerde(), pa.array(raw), what="k").to_pylist() == raw
    ints = [0, 1, -1, 2**40, -(2**63)]
    assert encode_array(IntSerde(), pa.array(ints), what="k").to_pylist() == [IntSerde().dumps(i) for i in ints]
    small = [5, -7, 0]
    assert encode_array(IntSerde(), pa.array(small, pa.int32()).slice(1), what="k").to_pylist() == [
        IntSerde().dumps(i) for i in small[1:]
    ]
    # JSON: structs become objects in field order, maps become objects, nested lists stay lists
    structs = pa.array([{"count": 1, "sum": 2}, {"count": 3, "sum": None}])
    assert encode_array(JsonSerde(), structs, what="v").to_pylist() == [
        b'{"count":1,"sum":2}',
        b'{"count":3,"sum":null}',
    ]
    maps = pa.array([[("a", 1), ("b", 2)]], pa.map_(pa.string(), pa.int64()))
    assert encode_array(JsonSerde(), maps, what="v").to_pylist() == [orjson.dumps({"a": 1, "b": 2})]
    lists = pa.array([[1, 2], []])
    assert encode_array(JsonSerde(), lists, what="v").to_pylist() == [b"[1,2]", b"[]"]
    assert encode_array(JsonSerde(), pa.array(["x"]), what="v").to_pylist() == [b'"x"']


def test_encoding_refuses_nulls_and_wrong_types_with_context() -> None:
    with pytest.raises(EncodeError, match="column 'key'.*null"):
        encode_array(StrSerde(), pa.array(["a", None]), what="column 'key'")
    kept = encode_array(JsonSerde(), pa.array([1, None]), what="v", nulls="keep")
    assert kept.to_pylist() == [b"1", None]
    with pytest.raises(EncodeError, match="StrSerde"):
        encode_array(StrSerde(), pa.array([1, 2]), what="column 'key'")


def test_spark_partition_keys_use_sparks_murmur3() -> None:
    # Spark's SELECT hash(0), hash(1) (the Spark suite checks more against the JVM).
    assert [_murmur3_int(v) for v in (0, 1)] == [933211791, -559580957]
    for n in (1, 2, 3, 7, 16):
        keys = spark_partition_keys(n)
        assert len(set(keys)) == n
        assert [_murmur3_int(k) % n for k in keys] == list(range(n))


def test_parse_positions_forms() -> None:
    want = {("t", 0): 10, ("t", 1): 20}
    assert parse_positions({("t", 0): 10, ("t", 1): 20}) == want
    assert parse_positions({"t": {0: 10, 1: 20}}) == want
    assert parse_positions(["t:0=10", "t:1=20"]) == want
    assert parse_positions("t:0=10,t:1=20") == want
    with pytest.raises(Exception, match="TOPIC:PARTITION=NEXT_OFFSET"):
        parse_positions(["t0=1"])


def test_vectorised_hash_is_fast_enough() -> None:
    keys = pa.array([f"user-{i}" for i in range(200_000)])
    import time

    t0 = time.perf_counter()
    processors_of(keys, 4, 4)
    assert time.perf_counter() - t0 < 2.0
    assert np.all(processors_of(keys.slice(0, 10), 4, 4) >= 0)


def _random_text(rng: random.Random) -> str:
    alphabet = ["a", "Z", "0", " ", "é", "ü", "日", "\u2028", "\u2029", "\U0001f600", "/", "<", "'"]
    rare = ['"', "\\", "\n", "\t", "\x00", "\x1f", "\x7f"]
    chars = [rng.choice(alphabet) if rng.random() > 0.05 else rng.choice(rare) for _ in range(rng.randrange(0, 12))]
    return "".join(chars)


@pytest.mark.parametrize("seed", range(6))
def test_json_fast_path_is_byte_identical_to_orjson(seed: int) -> None:
    rng = random.Random(seed)
    n = 400

    def maybe(v: object) -> object:
        return None if rng.random() < 0.1 else v

    ints = [maybe(rng.choice([0, -1, 1, 2**63 - 1, -(2**63), rng.randrange(-(10**12), 10**12)])) for _ in range(n)]
    bools = [maybe(rng.random() < 0.5) for _ in range(n)]
    texts = [maybe(_random_text(rng)) for _ in range(n)]
    plain_texts = [maybe("".join(rng.choice("abcé日 ") for _ in range(rng.randrange(6)))) for _ in range(n)]
    rows = [
        maybe({"i": i, "b": b, "s": s, "inner": maybe({"t": t, "j": i})})
        for i, b, s, t in zip(ints, bools, plain_texts, texts)
    ]
    columns = {
        "int64": pa.array(ints, pa.int64()),
        "uint64": pa.array([None if v is None else abs(v) for v in ints], pa.uint64()),
        "int8": pa.array([None if v is None else v % 100 for v in ints], pa.int8()),
        "bool": pa.array(bools),
        "text": pa.array(texts),
        "plain_text": pa.array(plain_texts, pa.large_string()),
        "struct": pa.array(rows),
        "floats": pa.array([maybe(rng.random() * 10 ** rng.randrange(-5, 20)) for _ in range(n)]),
    }
    for name, arr in columns.items():
        for view in (arr, arr.slice(7, 300)):
            got = encode_array(JsonSerde(), view, what=name, nulls="keep").to_pylist()
            want = [None if v is None else orjson.dumps(v) for v in view.to_pylist()]
            assert got == want, name


def test_missing_spark_extra_is_named_clearly() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.modules['pyspark'] = None\n"
        "sys.modules['pyarrow'] = None\n"
        "import streamkit.spark as sk\n"  # the package itself imports without the extra
        "from streamkit.spark import SparkExtraMissing\n"
        "try:\n"
        "    sk.backfill_table\n"
        "except SparkExtraMissing as exc:\n"
        "    print('ERR', exc)\n"
        "from streamkit.spark._deps import require\n"
        "try:\n"
        "    require('pyspark')\n"
        "except ImportError as exc:\n"
        "    print('ERR', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    lines = [ln for ln in out.splitlines() if ln.startswith("ERR")]
    assert len(lines) == 2
    assert all("'spark' extra" in ln and "pip install 'streamkit[spark]'" in ln for ln in lines)
