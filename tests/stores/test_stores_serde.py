from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stores.serde import IntSerde, JsonSerde, RawSerde, Serde, SerdeError, StrSerde, serde_for


@pytest.mark.parametrize(
    ("name", "cls"), [("json", JsonSerde), ("raw", RawSerde), ("str", StrSerde), ("int", IntSerde), ("JSON", JsonSerde)]
)
def test_serde_for_names(name: str, cls: type) -> None:
    s = serde_for(name)
    assert isinstance(s, cls)
    assert isinstance(s, Serde)


def test_serde_for_objects_and_classes() -> None:
    class Upper:
        def dumps(self, obj: str) -> bytes:
            return obj.upper().encode()

        def loads(self, data: bytes) -> str:
            return data.decode()

    u = Upper()
    assert serde_for(u) is u
    assert isinstance(serde_for(IntSerde), IntSerde)
    assert isinstance(serde_for(None), JsonSerde)


def test_serde_for_bad_name_is_named() -> None:
    with pytest.raises(ValueError, match="'yaml'") as info:
        serde_for("yaml")
    assert "json" in str(info.value)


@pytest.mark.parametrize("bad", [42, object(), b"json", ["json"]])
def test_serde_for_bad_object_is_named(bad: object) -> None:
    with pytest.raises(TypeError, match="not a serde") as info:
        serde_for(bad)
    assert type(bad).__name__ in str(info.value)


def test_json_roundtrip_and_encoder_is_orjson() -> None:
    s = JsonSerde()
    assert s.dumps is orjson.dumps  # no Python frame on the hot encode path
    obj = {"a": [1, 2.5, None, True], "b": "é"}
    assert s.loads(s.dumps(obj)) == obj
    s2 = JsonSerde(option=orjson.OPT_NON_STR_KEYS)
    assert s2.loads(s2.dumps({1: 2})) == {"1": 2}


def test_raw() -> None:
    s = RawSerde()
    assert s.dumps(b"x") == b"x"
    assert s.dumps(bytearray(b"xy")) == b"xy"
    assert s.loads(b"\x00\xff") == b"\x00\xff"
    with pytest.raises(TypeError, match="RawSerde needs bytes, got str"):
        s.dumps("x")


def test_str() -> None:
    s = StrSerde()
    assert s.loads(s.dumps("héllo")) == "héllo"
    with pytest.raises(TypeError, match="StrSerde needs str"):
        s.dumps(5)


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_int_roundtrip(n: int) -> None:
    s = IntSerde()
    data = s.dumps(n)
    assert len(data) == 8
    assert s.loads(data) == n


@given(st.lists(st.integers(min_value=0, max_value=2**63 - 1), min_size=2, max_size=20))
def test_int_bytes_order_for_non_negative(ns: list[int]) -> None:
    s = IntSerde()
    assert sorted(ns) == [s.loads(b) for b in sorted(s.dumps(n) for n in ns)]


def test_int_errors() -> None:
    s = IntSerde()
    assert s.dumps(-1) == b"\xff" * 8
    with pytest.raises(ValueError, match="does not fit"):
        s.dumps(2**63)
    with pytest.raises(TypeError, match="IntSerde needs int"):
        s.dumps("1")


@pytest.mark.parametrize(
    ("serde", "data", "name"),
    [
        (JsonSerde(), b"{not json", "JsonSerde"),
        (StrSerde(), b"\xff\xfe", "StrSerde"),
        (IntSerde(), b"\x01\x02", "IntSerde"),
    ],
)
def test_decode_errors_name_serde_and_bytes(serde: Serde, data: bytes, name: str) -> None:
    with pytest.raises(SerdeError) as info:
        serde.loads(data)
    msg = str(info.value)
    assert name in msg
    assert repr(data) in msg
    assert isinstance(info.value, ValueError)


def test_decode_error_repr_is_short() -> None:
    data = b"\xff" * 10_000
    with pytest.raises(SerdeError) as info:
        StrSerde().loads(data)
    msg = str(info.value)
    assert len(msg) < 400
    assert "10000 bytes" in msg


def test_relax_malloc_trim_is_idempotent() -> None:
    import sys

    from stores import relax_malloc_trim

    first = relax_malloc_trim()
    assert relax_malloc_trim() == first
    if sys.platform.startswith("linux"):
        assert first is True
