"""Admission alone: drops re-fetched records, cuts at holes, holds gates, checks epochs.

Pure logic against an in-memory consumer that records pause/resume/seek, and a
processor over an in-memory store: no broker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest
from aiokafka import TopicPartition

from stores.memory import MemoryStore
from streamkit.app import App
from streamkit.kafkaio import HOLE_CONFIRM_SECONDS
from streamkit.layout import transitions
from streamkit.layout.model import TopicLayout
from streamkit.layout.stamps import EPOCH_HEADER, PRODUCER_HEADER
from streamkit.runtime.admission import Admission
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.routes import Route

TP = TopicPartition("orders", 0)


@dataclass
class FakeConsumer:
    """Records what admission asks of a consumer."""

    paused: set[TopicPartition] = field(default_factory=set)
    seeks: list[tuple[TopicPartition, int]] = field(default_factory=list)

    def pause(self, *partitions: TopicPartition) -> None:
        self.paused.update(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self.paused.difference_update(partitions)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self.seeks.append((partition, offset))


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    offset: int
    key: bytes | None = b"k"
    value: bytes | None = b"1"
    headers: tuple[tuple[str, bytes], ...] = ()


def recs(offsets, partition: int = 0, epoch: int | None = None, key: bytes = b"k") -> list[Rec]:
    headers = () if epoch is None else ((EPOCH_HEADER, str(epoch).encode()), (PRODUCER_HEADER, b"p1"))
    return [Rec("orders", partition, o, key, b"1", headers) for o in offsets]


def make(
    layout: TopicLayout | None = None, position: int = 0, group_position: int = 0, partition: int = 0
) -> tuple[Admission, FakeConsumer, Route]:
    app = App("adm")
    topic = app.topic("orders")

    @app.processor(topic)
    def handle(key, value, ctx):  # pragma: no cover - never called here
        pass

    proc = ProcessorState(0, MemoryStore(()), {})  # type: ignore[arg-type]
    proc.positions[("orders", partition)] = position
    consumer = FakeConsumer()
    admission = Admission(consumer, group="g", name="m0")
    route = Route.build(proc, app.handlers["orders"], ("orders", partition), group_position, layout)
    admission.add(TopicPartition("orders", partition), route)
    return admission, consumer, route


def offsets(records) -> list[int]:
    return [r.offset for r in records]


def test_records_below_the_position_are_dropped_and_the_rest_delivered() -> None:
    admission, consumer, _ = make(position=5)
    [(route, out)] = admission.admit(TP, recs(range(3, 9)))
    assert offsets(out.deliver) == [5, 6, 7, 8] and out.rebuild == [] and out.late == []
    assert out.next_position == 9 and out.consumed == 4
    assert consumer.seeks == [] and consumer.paused == set()


def test_a_batch_already_applied_is_nothing_to_do() -> None:
    admission, _, _ = make(position=10)
    assert admission.admit(TP, recs(range(3, 9))) == []
    assert admission.admit(TopicPartition("orders", 7), recs([0])) == []  # not assigned


def test_records_the_group_handled_before_are_rebuilt_without_output() -> None:
    admission, _, _ = make(position=0, group_position=3)
    [(_, out)] = admission.admit(TP, recs(range(0, 6)))
    assert offsets(out.rebuild) == [0, 1, 2] and offsets(out.deliver) == [3, 4, 5]


def test_a_hole_is_asked_for_again_then_read_past_once_confirmed() -> None:
    admission, consumer, route = make()
    [(_, out)] = admission.admit(TP, recs([0, 1, 2, 5, 6]))
    assert offsets(out.deliver) == [0, 1, 2] and out.next_position == 3
    assert consumer.seeks == [(TP, 3)] and admission.holes_refetched == 1
    route.position = out.next_position
    # asked again at once: still there, not yet confirmed
    assert admission.admit(TP, recs([5, 6])) == []
    assert consumer.seeks[-1] == (TP, 3) and admission.holes_refetched == 1
    time.sleep(HOLE_CONFIRM_SECONDS * 2)
    [(_, out)] = admission.admit(TP, recs([5, 6]))
    assert offsets(out.deliver) == [5, 6] and out.next_position == 7


def test_a_hole_that_fills_when_asked_again_loses_nothing() -> None:
    admission, consumer, route = make()
    [(_, out)] = admission.admit(TP, recs([0, 3, 4]))
    assert offsets(out.deliver) == [0]
    route.position = out.next_position
    [(_, out)] = admission.admit(TP, recs([1, 2, 3, 4]))
    assert offsets(out.deliver) == [1, 2, 3, 4]
    assert out.next_position == 5


def expanded() -> TopicLayout:
    """orders: 1 -> 2 partitions; partition 1 was split from 0, whose seal is at 10."""
    lay = transitions.create("orders", 1, capacity=2, now_ms=0)
    lay = transitions.expand(lay, 2, announce_offsets={0: 8, 1: 0}, now_ms=1)
    return transitions.seal(lay, {0: 10, 1: 0})


def test_a_new_partition_is_held_until_the_group_passed_its_parents_seal() -> None:
    layout = expanded()
    admission, consumer, route = make(layout, partition=1)
    tp1 = TopicPartition("orders", 1)
    group = {0: 9}
    events = admission.regate(lambda t: layout, lambda t: dict(group))
    assert route.limit == 0 and tp1 in consumer.paused and admission.gated
    assert events.assigned == set()
    # a fetch that raced the pause delivers nothing and goes back to the limit
    [(_, out)] = admission.admit(tp1, recs([0, 1], partition=1, epoch=2))
    assert out.deliver == [] and out.next_position == 0 and consumer.seeks[-1] == (tp1, 0)
    group[0] = 10  # the group passed the seal of partition 0
    events = admission.regate(lambda t: layout, lambda t: dict(group))
    assert route.limit is None and tp1 not in consumer.paused and not admission.gated
    assert events.assigned == {tp1}
    assert admission.gate_waits and admission.gate_waits[0][:2] == ("orders", 1)


def test_a_members_own_position_on_the_parent_opens_the_gate_before_any_commit() -> None:
    layout = expanded()
    admission, consumer, parent = make(layout, partition=0, position=9)
    child = Route.build(parent.proc, parent.handlers, ("orders", 1), 0, layout)
    tp1 = TopicPartition("orders", 1)
    admission.add(tp1, child)
    admission.regate(lambda t: layout, lambda t: {})
    assert child.limit == 0 and tp1 in consumer.paused
    parent.position = 10  # this member applied partition 0 up to its seal
    events = admission.regate(lambda t: layout, lambda t: {})
    assert child.limit is None and tp1 not in consumer.paused and events.assigned == {tp1}


def test_a_record_from_a_newer_epoch_stops_the_batch_before_it() -> None:
    layout = expanded()
    admission, consumer, _ = make(layout, position=10)
    batch = recs([10, 11], epoch=2) + recs([12, 13], epoch=3)
    [(_, out)] = admission.admit(TP, batch)
    assert offsets(out.deliver) == [10, 11] and out.next_position == 12
    assert consumer.seeks[-1] == (TP, 12)
    assert admission.take_stale_epochs() == {"orders": 3} and admission.take_stale_epochs() == {}


def key_moved_to_1() -> bytes:
    from assignors.linear_hashing import lh_bucket
    from assignors.murmur2 import key_hash

    return next(k for i in range(1000) if lh_bucket(key_hash(k := f"k{i}".encode()), 1, 2) == 1)


def test_a_late_record_of_a_moved_key_is_reported_not_applied() -> None:
    layout = expanded()
    admission, _, _ = make(layout, position=10)
    moved = key_moved_to_1()
    batch = recs([10], epoch=2) + recs([11], epoch=1, key=moved) + recs([12], epoch=2)
    [(_, out)] = admission.admit(TP, batch)
    assert offsets(out.deliver) == [10, 12] and out.next_position == 13 and out.consumed == 3
    [(rec, report)] = out.late
    assert rec.offset == 11 and report["status"] == "late" and report["moved"] and report["producer"] == "p1"


def test_records_stamped_with_the_current_epoch_are_not_inspected() -> None:
    layout = expanded()
    admission, _, route = make(layout, position=10)
    assert route.epoch_bytes == b"2"
    [(_, out)] = admission.admit(TP, recs(range(10, 20), epoch=2))
    assert offsets(out.deliver) == list(range(10, 20)) and out.late == []


@pytest.mark.parametrize("position", [0, 3])
def test_positions_below_a_new_incarnation_skip_to_its_start(position: int) -> None:
    lay = transitions.create("orders", 1, capacity=2, now_ms=0)
    lay = transitions.seal(transitions.expand(lay, 2, announce_offsets={0: 0, 1: 7}, now_ms=1), {0: 0, 1: 7})
    admission, consumer, route = make(lay, partition=1, position=position)
    admission.regate(lambda t: lay, lambda t: {0: 0})
    assert route.position == 7 and consumer.seeks[-1] == (TopicPartition("orders", 1), 7)


def test_sharers_of_a_partition_each_admit_their_keys_from_their_own_position() -> None:
    """A shared task: two processors own the even and odd key hashes of one partition.
    The partition is fetched from the lower position; each route skips what it applied
    and the other's keys (before decoding), and keyless records go to the lowest sharer."""
    from assignors.murmur2 import key_hash
    from assignors.placement import KeyFilter

    admission, _, even = make(position=5)
    odd_proc = ProcessorState(1, MemoryStore(()), {})  # type: ignore[arg-type]
    odd_proc.positions[("orders", 0)] = 8
    odd = Route.build(odd_proc, even.handlers, ("orders", 0), 0, None)
    even.key_filter, even.sharers = KeyFilter(2, frozenset({0})), (0, 1)
    odd.key_filter, odd.sharers, odd.null_keys = KeyFilter(2, frozenset({1})), (0, 1), False
    admission.add(TP, odd)
    assert admission.fetch_position(TP) == 5
    keys = [f"k{i}".encode() for i in range(12)]
    batch = [Rec("orders", 0, o, keys[o] if o != 9 else None) for o in range(5, 12)]
    got = {route.proc.id: (offsets(a.deliver), a.next_position) for route, a in admission.admit(TP, batch)}
    parity = {o: key_hash(keys[o]) % 2 for o in range(5, 12) if o != 9}
    assert got[0] == ([o for o in range(5, 12) if o == 9 or parity.get(o) == 0], 12)
    assert got[1] == ([o for o in range(8, 12) if parity.get(o) == 1], 12)


def test_a_whole_partition_read_from_before_its_split_applies_only_its_processors_keys() -> None:
    """orders: 1 -> 2 partitions, job 1 -> 2 processors: processor 0 owns partition 0 whole,
    but below the seal (10) partition 0 also held the keys that are processor 1's now.
    Restarted from an old checkpoint (5), it must not apply those; from 10 on, it filters nothing."""
    from assignors.murmur2 import key_hash
    from streamkit.runtime.routes import mixed_history_end

    layout = expanded()
    assert mixed_history_end(layout, 0) == 10 and mixed_history_end(layout, 1) == 0 and mixed_history_end(None, 0) == 0
    admission, _, old = make(layout, position=5)
    route = Route.for_slot(
        old.proc, old.handlers, ("orders", 0), 0, layout, key_filter=None, sharers=(), p0=1, p=2
    )  # fmt: skip
    admission.routes[TP] = [route]
    keys = [f"k{i}".encode() for i in range(14)]
    [(_, out)] = admission.admit(TP, [Rec("orders", 0, o, keys[o]) for o in range(5, 14)])
    assert offsets(out.deliver) == [o for o in range(5, 14) if o >= 10 or key_hash(keys[o]) % 2 == 0]
    route.position = out.next_position
    beyond = Route.for_slot(old.proc, old.handlers, ("orders", 0), 0, layout, key_filter=None, sharers=(), p0=1, p=2)
    assert beyond.key_filter is None  # its position (14) is past the mixed history
