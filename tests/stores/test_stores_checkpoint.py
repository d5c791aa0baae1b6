from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stores import Checkpoint, StoreError

topics = st.text(min_size=1, max_size=8)
tps = st.tuples(topics, st.integers(0, 1000))
offsets = st.integers(0, 2**62)
checkpoints = st.builds(
    Checkpoint,
    positions=st.dictionaries(tps, offsets, max_size=5),
    layout_epochs=st.dictionaries(topics, st.integers(0, 2**31), max_size=3),
    generation=st.integers(-1, 2**31),
    ic_ranges=st.dictionaries(tps, st.lists(st.tuples(offsets, offsets), max_size=3), max_size=3),
    extra=st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1) | st.text() | st.none(), max_size=3),
)


@given(checkpoints)
def test_roundtrip(cp: Checkpoint) -> None:
    assert Checkpoint.from_bytes(cp.to_bytes()) == cp


@given(checkpoints)
def test_to_bytes_is_stable_under_insertion_order(cp: Checkpoint) -> None:
    reordered = Checkpoint(
        positions=dict(reversed(list(cp.positions.items()))),
        layout_epochs=dict(reversed(list(cp.layout_epochs.items()))),
        generation=cp.generation,
        ic_ranges=dict(reversed(list(cp.ic_ranges.items()))),
        extra=dict(reversed(list(cp.extra.items()))),
    )
    assert reordered.to_bytes() == cp.to_bytes()


def test_empty_and_helpers() -> None:
    e = Checkpoint.empty()
    assert e.is_empty()
    assert e.generation == -1
    assert e.position("t", 0) == 0
    cp = e.replace(positions={("t", 0): 7}, generation=3)
    assert cp.position("t", 0) == 7 and not cp.is_empty()
    assert e.positions == {}  # replace did not touch the original
    with pytest.raises(dataclasses.FrozenInstanceError):
        cp.generation = 4  # type: ignore[misc]


def test_format_is_json_with_version() -> None:
    cp = Checkpoint(positions={("in", 2): 10}, layout_epochs={"in": 1}, generation=5, ic_ranges={("in", 2): [(12, 14)]})
    assert cp.to_bytes() == (
        b'{"extra":{},"format":1,"generation":5,"ic_ranges":[["in",2,[[12,14]]]],'
        b'"layout_epochs":{"in":1},"positions":[["in",2,10]]}'
    )


@pytest.mark.parametrize("data", [b"", b"[]", b'{"format": 99}', b'{"format": 1}', b"\xff"])
def test_corrupt_checkpoint(data: bytes) -> None:
    with pytest.raises(StoreError):
        Checkpoint.from_bytes(data)


def test_unserialisable_extra() -> None:
    with pytest.raises(StoreError, match="not JSON-serialisable"):
        Checkpoint(extra={"x": object()}).to_bytes()
