"""Layout values and transitions, placement, registry acceptance, epoch stamps (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from assignors.murmur2 import kafka_partition
from streamkit.layout import transitions
from streamkit.layout.epochs import EpochStamp, ZombieError, check_stamp, newer_epochs_needed
from streamkit.layout.model import ChangeKind, LayoutError, PartitionMode, PendingChangeError, TopicLayout
from streamkit.layout.placement import Placer, partition_for_key
from streamkit.layout.registry import accepts

from .test_gating import sealed_expand, sealed_shrink

RW, RO, NONE = PartitionMode.READ_WRITE, PartitionMode.READ_ONLY, PartitionMode.NONE


def test_create_expand_shrink_finish_epochs_and_modes():
    lay = transitions.create("t", 3, capacity=8, now_ms=0)
    assert (lay.epoch, lay.n0, lay.active, lay.physical, lay.version) == (1, 3, 3, 8, (1, 1))
    assert lay.modes == (RW,) * 3 + (NONE,) * 5
    ann = transitions.expand(lay, 6, announce_offsets={p: p for p in range(8)}, now_ms=5)
    assert (ann.epoch, ann.active, ann.version) == (2, 6, (2, 0))
    assert ann.pending is not None and ann.pending.partitions == (3, 4, 5)
    with pytest.raises(PendingChangeError, match="resume"):
        transitions.shrink(ann, 4)
    sealed = transitions.seal(ann, {p: 10 + p for p in range(6)})
    assert sealed.version == (2, 1) and sealed.pending is None and sealed.epoch == 2
    assert sealed.base_offset(4) == 4 and sealed.base_offset(1) == 0
    sh = transitions.seal(transitions.shrink(sealed, 4, 30, now_ms=1000), {})
    assert sh.epoch == 3 and sh.modes == (RW,) * 4 + (RO,) * 2 + (NONE,) * 2
    assert sh.draining == (4, 5) and sh.readable == (0, 1, 2, 3, 4, 5)
    assert sh.drain_deadline_ms(4) == 31_000
    with pytest.raises(LayoutError, match="drains for"):
        transitions.finish_drain(sh, 4, now_ms=2000)
    fin = transitions.finish_drain(sh, [4, 5], now_ms=31_000)
    assert fin.epoch == 4 and fin.draining == () and fin.mode(5) == NONE
    assert [s.kind for s in fin.seals] == [ChangeKind.CREATE, ChangeKind.EXPAND, ChangeKind.SHRINK, ChangeKind.FINISH]
    assert [fin.active_at(e) for e in (1, 2, 3, 4)] == [3, 6, 4, 4]


def test_expand_refused_while_draining_and_other_errors():
    lay = sealed_expand(transitions.create("t", 2, capacity=6, now_ms=0), 4)
    sh = sealed_shrink(lay, 3, delay=60)
    with pytest.raises(LayoutError, match=r"cannot expand t: partitions \[3\] are still draining"):
        transitions.expand(sh, 4)
    with pytest.raises(LayoutError, match="below its initial count 2"):
        transitions.shrink(lay, 1)
    with pytest.raises(LayoutError, match="only 6 physical"):
        transitions.expand(lay, 7)
    assert transitions.expand(lay, 7, physical=8).physical == 8
    with pytest.raises(LayoutError, match="use shrink"):
        transitions.expand(lay, 3)
    with pytest.raises(LayoutError, match="use expand"):
        transitions.shrink(lay, 5)
    with pytest.raises(LayoutError, match="not draining"):
        transitions.finish_drain(lay, 1)
    with pytest.raises(LayoutError, match="no announced change"):
        transitions.seal(lay, {})
    with pytest.raises(LayoutError, match="below its announce offset"):
        transitions.seal(transitions.expand(lay, 5, announce_offsets={0: 9}), {0: 8})
    with pytest.raises(LayoutError):
        transitions.create("t", 4, capacity=2)
    with pytest.raises(LayoutError, match="ReadWrite"):
        TopicLayout("t", 2, 2, 3, (RW, RW, RW), 1)


def test_round_trip_and_versions():
    lay = sealed_shrink(sealed_expand(transitions.create("t", 2, capacity=6, now_ms=0), 5), 3, delay=9)
    lay = transitions.set_ordered_delivery(lay, False)
    again = TopicLayout.from_dict(lay.to_dict())
    assert again == lay and hash(again) == hash(lay)
    pend = transitions.expand(transitions.finish_drain(lay, [3, 4], force=True), 6)
    assert TopicLayout.from_dict(pend.to_dict()) == pend
    assert pend.version > lay.version


@given(st.integers(1, 8), st.integers(0, 64), st.binary(min_size=0, max_size=24))
def test_placement_is_linear_hashing_and_never_off_readwrite(n0, extra, key):
    active = n0 + extra
    lay = transitions.create("t", n0, capacity=active, now_ms=0)
    if active > n0:
        lay = sealed_expand(lay, active)
    p = partition_for_key(lay, key)
    assert 0 <= p < active and lay.mode(p) == RW
    assert Placer(lay)(key) == p
    if active == n0:
        assert p == kafka_partition(key, n0)  # adopts topics written by Kafka's partitioner


def test_placer_round_robins_null_keys_over_writable_only():
    lay = sealed_shrink(sealed_expand(transitions.create("t", 2, capacity=8, now_ms=0), 6), 3)
    pl = Placer(lay)
    assert sorted({pl(None) for _ in range(30)}) == [0, 1, 2]


def test_registry_acceptance_rules():
    a = transitions.create("t", 2, capacity=4, now_ms=0, change_id="c1")
    b = transitions.expand(a, 3, change_id="c2")
    b_sealed = transitions.seal(b, {})
    c = transitions.seal(transitions.shrink(b_sealed, 2, change_id="c3"), {})
    assert accepts(None, b)[0]
    assert accepts(a, b)[0] and accepts(b, b_sealed)[0] and accepts(b, c)[0]  # gap ok if history continues
    ok, why = accepts(b_sealed, b)
    assert not ok and why.startswith("stale")
    assert not accepts(c, a)[0]
    rival = transitions.expand(a, 4, change_id="other")
    ok, why = accepts(b, rival)
    assert not ok and why.startswith("stale")  # same epoch, first in the log wins
    rival_later = transitions.seal(transitions.shrink(transitions.seal(rival, {}), 3), {})
    ok, why = accepts(b_sealed, rival_later)
    assert not ok and "conflict" in why


def test_epoch_stamps_reject_zombies():
    stored = EpochStamp({"a": 5, "b": 2}, generation=7)
    check_stamp(None, stored)
    check_stamp(stored, EpochStamp({"a": 5, "b": 3}, 7))
    check_stamp(stored, EpochStamp({"a": 6}, 8))
    with pytest.raises(ZombieError, match="generation 6 < 7"):
        check_stamp(stored, EpochStamp({"a": 9}, 6))
    with pytest.raises(ZombieError, match="a layout epoch 4 < 5"):
        check_stamp(stored, EpochStamp({"a": 4}, 9))

    class Ckpt:  # duck-typed like stores.base.Checkpoint
        layout_epochs = {"a": 5}
        generation = 7

    check_stamp(Ckpt(), {"layout_epochs": {"a": 5}, "generation": 7})
    assert newer_epochs_needed(Ckpt(), {"a": 4}) == {"a": 5}
    assert stored.merge(EpochStamp({"a": 1, "c": 1}, 9)) == EpochStamp({"a": 5, "b": 2, "c": 1}, 9)
