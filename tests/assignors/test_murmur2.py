"""assignors.murmur2 against published Java-client vectors and a literal Java port."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assignors.murmur2 import (
    kafka_partition,
    key_hash,
    key_hash_cached,
    murmur2,
    murmur2_unsigned,
)

_MASK = 0xFFFFFFFF


def java_murmur2(data: bytes) -> int:
    """Line-by-line port of ``org.apache.kafka.common.utils.Utils.murmur2`` (signed),
    independent of the optimised code under test."""
    length = len(data)
    m = 0x5BD1E995
    h = (0x9747B28C ^ length) & _MASK
    for i in range(length // 4):
        i4 = i * 4
        k = data[i4] + (data[i4 + 1] << 8) + (data[i4 + 2] << 16) + (data[i4 + 3] << 24)
        k = (k * m) & _MASK
        k ^= k >> 24  # Java: k >>> r on an int
        k = (k * m) & _MASK
        h = (h * m) & _MASK
        h ^= k
    rest = length % 4
    tail = length & ~3
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & _MASK
    h ^= h >> 13
    h = (h * m) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


# apache/kafka clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java,
# testMurmur2 (Java's signed int results).
KAFKA_UTILS_TEST = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}

# confluentinc/librdkafka src/rdmurmur2.c, unittest_murmur2 (java_murmur2_results,
# written there as int32 hex).
LIBRDKAFKA = {
    b"kafka": 0xD067CF64,
    b"giberish123456789": 0x8F552B0C,
    b"1234": 0x9FC97B14,
    b"234": 0xE7C009CA,
    b"34": 0x873930DA,
    b"4": 0x5A4B5CA1,
    b"PreAmbleWillBeRemoved,ThePrePartThatIs": 0x78424F1C,
    b"reAmbleWillBeRemoved,ThePrePartThatIs": 0x4A62B377,
    b"eAmbleWillBeRemoved,ThePrePartThatIs": 0xE0E4E09E,
    b"AmbleWillBeRemoved,ThePrePartThatIs": 0x62B8B43F,
    b"": 0x106E08D9,
}

# dpkp/kafka-python test/test_partitioner.py, test_murmur2_java_compatibility:
# partition among 1000 partitions, "compare with output from Kafka's
# org.apache.kafka.clients.producer.Partitioner".
KAFKA_PYTHON_PARTITIONS_OF_1000 = {
    b"": 681,
    b"a": 524,
    b"ab": 434,
    b"abc": 107,
    b"123456789": 566,
    b"\x00 ": 742,
}

# akka/akka Murmur2Spec.scala ("expected correct hash values from the kafka murmur2 impl").
AKKA = {b"1": -1993445489, b"12": 126087238, b"123": -267702483, b"1234": -1614185708, b"12345": -1188365604}


@pytest.mark.parametrize(("data", "expected"), sorted(KAFKA_UTILS_TEST.items()))
def test_kafka_utils_test_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected
    assert java_murmur2(data) == expected


@pytest.mark.parametrize(("data", "expected"), sorted(LIBRDKAFKA.items()))
def test_librdkafka_vectors(data: bytes, expected: int) -> None:
    assert murmur2_unsigned(data) == expected
    assert murmur2(data) & 0xFFFFFFFF == expected


@pytest.mark.parametrize(("data", "expected"), sorted(AKKA.items()))
def test_akka_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


@pytest.mark.parametrize(("data", "expected"), sorted(KAFKA_PYTHON_PARTITIONS_OF_1000.items()))
def test_kafka_python_partition_vectors(data: bytes, expected: int) -> None:
    assert kafka_partition(data, 1000) == expected


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_equals_literal_java_port(data: bytes) -> None:
    signed = murmur2(data)
    assert signed == java_murmur2(data)
    assert -(2**31) <= signed < 2**31
    assert murmur2_unsigned(data) == signed & 0xFFFFFFFF
    assert key_hash(data) == signed & 0x7FFFFFFF
    assert key_hash_cached(data) == key_hash(data)


@given(st.binary(max_size=40), st.integers(min_value=1, max_value=10_000))
def test_kafka_partition_is_positive_hash_mod_n(data: bytes, n: int) -> None:
    assert kafka_partition(data, n) == (java_murmur2(data) & 0x7FFFFFFF) % n


def test_long_keys_and_every_tail_length() -> None:
    # Lengths 0..300 cover the precompiled word decoders and the on-the-fly format.
    data = bytes(range(256)) * 2
    for length in range(0, 300):
        assert murmur2(data[:length]) == java_murmur2(data[:length])
    big = b"\xff\x81" * 50_000
    assert murmur2(big) == java_murmur2(big)


def test_bytes_like_inputs() -> None:
    assert key_hash(bytearray(b"foobar")) == key_hash(b"foobar")
    assert key_hash(memoryview(b"xfoobarx")[1:-1]) == key_hash(b"foobar")
    assert murmur2("é".encode()) == java_murmur2(b"\xc3\xa9")


def test_kafka_partition_rejects_bad_count() -> None:
    with pytest.raises(ValueError, match="partition count"):
        kafka_partition(b"k", 0)
