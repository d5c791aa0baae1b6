"""Pure gating: constraints, gates, key callbacks, late records."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assignors.linear_hashing import deletion_blockers, expansion_blockers, lh_bucket
from streamkit.layout import model, transitions
from streamkit.layout.gating import (
    GateTracker,
    compute_gate,
    constraints,
    gate_limits,
)
from streamkit.layout.model import ChangeKind
from streamkit.layout.stamps import RecordStatus, classify_record, record_epoch, record_producer, stamp

from .sim import run_random


def sealed_expand(layout, n2, announce=None, seal=None):
    a = announce if announce is not None else {p: 0 for p in range(layout.physical)}
    lay = transitions.expand(layout, n2, announce_offsets=a, now_ms=1)
    s = seal if seal is not None else {p: a.get(p, 0) for p in lay.readable}
    return transitions.seal(lay, s)


def sealed_shrink(layout, n2, announce=None, seal=None, delay=0):
    a = announce if announce is not None else {p: 0 for p in layout.readable}
    lay = transitions.shrink(layout, n2, delay, announce_offsets=a, now_ms=1)
    s = seal if seal is not None else {p: a.get(p, 0) for p in lay.readable}
    return transitions.seal(lay, s)


# ---------------------------------------------------------------- expansion


def test_new_partition_waits_for_parent_seal():
    lay = transitions.create("t", 4, capacity=8, now_ms=0)
    lay = sealed_expand(
        lay, 6, announce={0: 100, 1: 50, 2: 7, 3: 9, 4: 3, 5: 0}, seal={0: 120, 1: 60, 2: 8, 3: 9, 4: 3, 5: 0}
    )
    # 4 splits from 0, 5 from 1
    assert {(c.partition, c.blocker, c.from_offset, c.need) for c in constraints(lay)} == {
        (4, 0, 3, 120),
        (5, 1, 0, 60),
    }
    g = compute_gate(lay, [0, 4, 5], {0: 119, 1: 60})
    assert g.gates[4].limit == 3 and g.gates[4].start == 3 and not g.gates[4].deliverable(3)
    assert g.gates[5].limit is None and g.gates[0].limit is None
    assert g.watch == {0}
    assert g.revoke_points == {0: (120,)}
    assert gate_limits(lay, [4], {0: 120}) == {4: None}


def test_pending_expansion_blocks_new_partitions_entirely():
    lay = transitions.create("t", 2, capacity=4, now_ms=0)
    lay = transitions.expand(lay, 3, announce_offsets={0: 10, 1: 10, 2: 5, 3: 0}, now_ms=1)
    g = compute_gate(lay, [0, 1, 2], {0: 10**9, 1: 10**9})
    assert g.gates[2].limit == 5 and g.gates[2].waiting_on == ((0, None),)
    assert g.gates[0].limit is None and g.gates[1].limit is None


@given(st.integers(1, 6), st.integers(1, 40), st.integers(1, 40))
def test_expansion_constraints_follow_expansion_blockers(n0, a, b):
    old, new = n0 + min(a, b) - 1, n0 + max(a, b)
    lay = transitions.create("t", n0, capacity=new, now_ms=0)
    if old > n0:
        lay = sealed_expand(lay, old)
    lay = sealed_expand(lay, new, seal={p: 1000 + p for p in range(new)})
    mine = {(c.partition, c.blocker): c.need for c in constraints(lay) if c.epoch == lay.epoch}
    assert mine == {(c, q): 1000 + q for c, q in expansion_blockers(n0, old, new).items()}


# ---------------------------------------------------------------- shrink


@given(st.integers(1, 5), st.integers(0, 40), st.integers(0, 40))
def test_shrink_constraints_follow_deletion_blockers(n0, a, b):
    new, old = n0 + min(a, b), n0 + max(a, b) + 1
    lay = sealed_expand(transitions.create("t", n0, capacity=old, now_ms=0), old)
    ann = {p: 10 * p + 5 for p in range(old)}
    seal = {p: 10 * p + 7 for p in range(old)}
    lay = sealed_shrink(lay, new, announce=ann, seal=seal)
    mine: dict[int, set[int]] = {}
    for c in constraints(lay):
        if c.epoch == lay.epoch:
            assert c.kind == ChangeKind.SHRINK
            assert c.from_offset == ann[c.partition] and c.need == seal[c.blocker]
            mine.setdefault(c.partition, set()).add(c.blocker)
    assert mine == deletion_blockers(n0, old, new)


def test_survivor_delivers_up_to_announce_offset_then_waits_for_drained():
    lay = sealed_expand(transitions.create("t", 2, capacity=4, now_ms=0), 4)
    # shrink 4 -> 2: 2 merges into 0, 3 into 1
    lay = sealed_shrink(lay, 2, announce={0: 10, 1: 20, 2: 30, 3: 40}, seal={0: 15, 1: 22, 2: 33, 3: 41})
    g = compute_gate(lay, [0, 1, 2, 3], {2: 32, 3: 41})
    assert g.gates[0].limit == 10 and g.gates[0].waiting_on == ((2, 33),)
    assert g.gates[1].limit is None
    assert g.gates[2].limit is None and g.gates[3].limit is None  # draining partitions flow
    assert (lay.writable, lay.draining) == ((0, 1), (2, 3))


def test_finish_drain_retires_and_reexpansion_starts_new_incarnation():
    lay = sealed_expand(transitions.create("t", 2, capacity=4, now_ms=0), 4)
    lay = sealed_shrink(lay, 3, announce={0: 1, 1: 1, 2: 1, 3: 50}, seal={0: 1, 1: 2, 2: 1, 3: 60})
    assert compute_gate(lay, [1], {}).gates[1].limit == 1
    lay = transitions.finish_drain(lay, 3, now_ms=10)
    assert lay.mode(3) == model.PartitionMode.NONE
    g = compute_gate(lay, [1, 3], {})
    assert g.gates[1].limit is None  # nothing waits for a given-up partition
    assert g.gates[3].skip and g.limits[3] == g.gates[3].start
    # re-expansion: partition 3 restarts at the high watermark it had then
    lay = sealed_expand(lay, 4, announce={0: 5, 1: 8, 2: 5, 3: 60}, seal={0: 5, 1: 9, 2: 5, 3: 60})
    assert lay.base_offset(3) == 60
    g = compute_gate(lay, [3], {1: 8})
    assert (g.gates[3].start, g.gates[3].limit) == (60, 60)
    assert compute_gate(lay, [3], {1: 9}).gates[3].limit is None


def test_ordered_delivery_off_removes_gates_but_not_skips():
    lay = sealed_expand(transitions.create("t", 2, capacity=4, now_ms=0), 3, seal={0: 99, 1: 0, 2: 0})
    assert compute_gate(lay, [2], {}).gates[2].limit == 0
    off = transitions.set_ordered_delivery(lay, False)
    assert off.epoch == lay.epoch + 1
    g = compute_gate(off, [2, 3], {})
    assert g.gates[2].limit is None and g.gates[3].skip


# ---------------------------------------------------------------- whole histories


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(1, 3), st.integers(1, 3))
def test_random_histories_keep_every_producers_key_order(seed, n0, producers):
    """Expansions, shrinks and drains in any order, producers switching at any time
    before the seal, a consumer delivering any deliverable partition: each producer's
    records of a key are delivered in the order produced, and everything is delivered."""
    w = run_random(random.Random(seed), 400, n0=n0, producers=producers, capacity=n0 * 6)
    assert w.order_violations() == []
    assert w.undelivered() == {}
    # nothing late without fenced producers
    assert all(not w.verdict(p, o, r).violation for p, o, r in w.delivered)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_fenced_producer_misorder_is_always_flagged_late(seed):
    """A producer that misses changes and catches up later may break order; every record
    delivered out of order is recognised by its epoch as LATE with a moved key."""
    w = run_random(random.Random(seed), 500, fenced=1, n0=2, producers=3, capacity=12)
    for p, off, rec in w.order_violations():
        v = w.verdict(p, off, rec)
        assert v.status == RecordStatus.LATE and v.moved and v.violation, (p, off, rec, v)


def test_fenced_producer_scenario_is_detected():
    """Deterministic version: old-epoch record lands after the seal, then the producer
    catches up and writes the same key to the new partition."""
    import random as _r

    from .sim import World

    w = World(_r.Random(1), n0=1, capacity=2, producers=2, keys=64)
    w.producers[1].fenced = True
    key = next(k for k in w.keys if lh_bucket(w.hashes[k], 1, 2) == 1)  # moves 0 -> 1
    w.produce(1, key)
    assert w.announce()
    while w.switch_one():
        pass
    assert w.seal()
    w.produce(1, key)  # late: old epoch, partition 0, beyond the seal
    assert w.wake_fenced()
    w.produce(1, key)  # new layout: partition 1
    w.drain_all()
    late = [(p, o, r) for p, o, r in w.delivered if w.verdict(p, o, r).status == RecordStatus.LATE]
    assert [(p, r.seq) for p, _, r in late] == [(0, 2)]
    assert w.verdict(*late[0]).moved


# ---------------------------------------------------------------- callbacks


def test_tracker_fires_revoke_then_assign_once():
    lay = sealed_expand(transitions.create("t", 1, capacity=2, now_ms=0), 2, seal={0: 10, 1: 0})
    tr = GateTracker()
    # member A owns 0, member B owns 1 (separate trackers)
    b = GateTracker()
    u = tr.update(lay, [0], {0: 3}, {0: 5})
    assert u.fire_revoked == () and u.fire_assigned == ()
    u = tr.update(lay, [0], {0: 3}, {0: 10})
    assert u.fire_revoked == (0,)
    assert tr.update(lay, [0], {0: 3}, {0: 11}).fire_revoked == ()  # once
    ub = b.update(lay, [1], {0: 3}, {})
    assert ub.fire_assigned == () and ub.state.gates[1].limit == 0
    ub = b.update(lay, [1], {0: 10}, {})
    assert ub.fire_assigned == (1,) and ub.state.gates[1].limit is None
    assert b.update(lay, [1], {0: 10}, {1: 0}).fire_assigned == ()


def test_tracker_assign_not_fired_when_already_past():
    lay = sealed_expand(transitions.create("t", 1, capacity=2, now_ms=0), 2, seal={0: 10, 1: 0})
    assert GateTracker().update(lay, [1], {0: 10}, {1: 7}).fire_assigned == ()


# ---------------------------------------------------------------- records


def test_classify_record_cases():
    lay = sealed_expand(
        transitions.create("t", 2, capacity=4, now_ms=0), 3, announce={0: 5, 1: 5, 2: 2, 3: 0}, seal={0: 8, 1: 6, 2: 4}
    )
    moved = next(h for h in range(1000) if lh_bucket(h, 2, 2) == 0 and lh_bucket(h, 2, 3) == 2)
    stays = next(h for h in range(1000) if lh_bucket(h, 2, 2) == 0 and lh_bucket(h, 2, 3) == 0)
    assert classify_record(lay, 0, 7, 1, moved).status == RecordStatus.OK
    v = classify_record(lay, 0, 8, 1, moved)
    assert (v.status, v.moved, v.seal_epoch, v.violation) == (RecordStatus.LATE, True, 2, True)
    v = classify_record(lay, 0, 9, 1, stays)
    assert (v.status, v.moved, v.violation) == (RecordStatus.LATE, False, False)
    assert classify_record(lay, 0, 9, 2, stays).status == RecordStatus.OK
    assert classify_record(lay, 0, 9, 3, stays).status == RecordStatus.NEWER
    assert classify_record(lay, 2, 1, 2, moved).status == RecordStatus.DEAD
    assert classify_record(lay, 2, 3, 1, moved).status == RecordStatus.MISPLACED  # 2 not writable at epoch 1
    assert classify_record(lay, 1, 3, 2, moved).status == RecordStatus.MISPLACED  # key belongs to 2
    assert classify_record(lay, 0, 3, None, moved).status == RecordStatus.UNSTAMPED
    assert record_epoch([("a", b"x"), ("streamkit.epoch", b"12")]) == 12
    assert record_epoch([("streamkit.epoch", b"zz")]) is None


def test_stamps_are_one_compact_header_and_earlier_stamps_stay_readable() -> None:
    tag = b"0a1b2c"
    header = stamp(tag, 12)
    assert header == ("sk", b"0a1b2c12") and header[1].decode() == "0a1b2c12"  # text, readable by any tool
    assert record_epoch([("trace", b"x"), header]) == 12 and record_producer([header]) == "0a1b2c"
    earlier = [("streamkit.epoch", b"7"), ("streamkit.producer", b"api-0a1b2c3d4e5f")]
    assert record_epoch(earlier) == 7 and record_producer(earlier) == "api-0a1b2c3d4e5f"
    for not_a_stamp in ([("sk", b"short")], [("sk", tag + b"x1")], [("sk", tag)], []):
        assert record_epoch(not_a_stamp) is None
    with pytest.raises(ValueError, match="6 ASCII characters"):
        stamp(b"abc", 1)


def test_none_partitions_are_skipped_and_pending_shrink_limits_survivors():
    lay = sealed_expand(transitions.create("t", 2, capacity=6, now_ms=0), 4)
    lay = transitions.shrink(lay, 2, 60, announce_offsets={0: 3, 1: 4, 2: 5, 3: 6}, now_ms=1)
    g = compute_gate(lay, range(6), {2: 10**6, 3: 10**6})
    assert g.gates[0].limit == 3 and g.gates[1].limit == 4  # seal unknown: wait
    assert g.skip == {4, 5}
    with pytest.raises(model.PendingChangeError):
        transitions.finish_drain(lay, 2)
