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
from streamkit.kafkaio import HOLE_CONFIRM_FETCHES
from streamkit.layout import transitions
from streamkit.layout.model import TopicLayout
from streamkit.layout.seal import OriginSeal
from streamkit.layout.stamps import EPOCH_HEADER, PRODUCER_HEADER
from streamkit.layout.stamps import stamp as stamp_header
from streamkit.runtime import admission as admission_module
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


TAG = b"00a1a1"


def recs(
    offsets, partition: int = 0, epoch: int | None = None, key: bytes = b"k", *, earlier_stamp: bool = False
) -> list[Rec]:
    """Records stamped with ``epoch`` by producer TAG (``earlier_stamp``: as streamkit's
    producer stamped them before the one-header stamp), or unstamped."""
    headers: tuple[tuple[str, bytes], ...] = ()
    if epoch is not None and earlier_stamp:
        headers = ((EPOCH_HEADER, str(epoch).encode()), (PRODUCER_HEADER, b"p1"))
    elif epoch is not None:
        headers = (stamp_header(TAG, epoch),)
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
    admission = Admission(consumer, group="g", name="m0", seal=SEAL)
    route = Route.build(proc, app.handlers["orders"], ("orders", partition), group_position, layout)
    admission.add(TopicPartition("orders", partition), route)
    return admission, consumer, route


SEAL = OriginSeal(b"s" * 32)
"""The cluster's seal in these tests (``streamkit.layout.seal``)."""


def stamp(layout: TopicLayout) -> tuple[tuple[str, bytes], ...]:
    """The headers streamkit's producer writes under ``layout``."""
    return (stamp_header(TAG, layout.epoch),)


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


def test_a_hole_is_asked_for_again_then_read_past_once_confirmed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission_module, "HOLE_CONFIRM_SECONDS", 0.05)
    admission, consumer, route = make()
    [(_, out)] = admission.admit(TP, recs([0, 1, 2, 5, 6]))
    assert offsets(out.deliver) == [0, 1, 2] and out.next_position == 3
    assert consumer.seeks == [(TP, 3)] and admission.holes_refetched == 1
    route.position = out.next_position
    for _ in range(HOLE_CONFIRM_FETCHES - 1):  # asked again: still there, not yet confirmed
        assert admission.admit(TP, recs([5, 6])) == []
        assert consumer.seeks[-1] == (TP, 3) and admission.holes_refetched == 1
    time.sleep(0.1)
    [(_, out)] = admission.admit(TP, recs([5, 6]))
    assert offsets(out.deliver) == [5, 6] and out.next_position == 7
    assert admission.holes_read_past == 1


def test_a_hole_is_not_read_past_by_many_quick_fetches_nor_by_one_slow_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tansu writes a batch after handing out its offsets: on a loaded machine the hole can
    last longer than a few fetches take, or than one pause of the loop. Either alone is
    not proof that the records are not coming."""
    monkeypatch.setattr(admission_module, "HOLE_CONFIRM_SECONDS", 0.05)
    admission, consumer, route = make()
    [(_, out)] = admission.admit(TP, recs([0, 3]))
    route.position = out.next_position
    for _ in range(10):  # many fetches at once: too soon
        assert admission.admit(TP, recs([3])) == []
    admission2, _, route2 = make()
    [(_, out)] = admission2.admit(TP, recs([0, 3]))
    route2.position = out.next_position
    time.sleep(0.1)  # one fetch after a long pause: too few
    assert admission2.admit(TP, recs([3])) == []
    assert admission.holes_read_past == admission2.holes_read_past == 0
    [(_, out)] = admission.admit(TP, recs([1, 2, 3]))  # the late batch is written: nothing lost
    assert offsets(out.deliver) == [1, 2, 3]


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
    assert rec.offset == 11 and report["status"] == "late" and report["moved"] and report["producer"] == TAG.decode()


def test_late_records_sharing_their_batch_s_stamp_are_all_reported() -> None:
    """The fetch path hands a batch's one stamp object to its records; an old epoch there
    is inspected like one on every record."""
    layout = expanded()
    admission, _, _ = make(layout, position=10)
    moved = key_moved_to_1()
    shared = (stamp_header(TAG, 1),)
    batch = [Rec("orders", 0, o, moved, b"1", shared) for o in range(10, 14)]
    [(_, out)] = admission.admit(TP, batch)
    assert out.deliver == [] and [r.offset for r, _ in out.late] == [10, 11, 12, 13]


def test_records_with_an_earlier_stamp_are_checked_as_before() -> None:
    layout = expanded()
    admission, _, _ = make(layout, position=10)
    moved = key_moved_to_1()
    batch = recs([10], epoch=2, earlier_stamp=True) + recs([11], epoch=1, key=moved, earlier_stamp=True)
    batch += recs([12], epoch=2)
    [(_, out)] = admission.admit(TP, batch)
    assert offsets(out.deliver) == [10, 12] and out.next_position == 13
    [(rec, report)] = out.late
    assert rec.offset == 11 and report["producer"] == "p1" and report["record_epoch"] == 1


def test_records_stamped_with_the_current_epoch_are_not_inspected() -> None:
    layout = expanded()
    admission, _, route = make(layout, position=10)
    assert route.epoch_bytes == b"2"
    [(_, out)] = admission.admit(TP, recs(range(10, 20), epoch=2))
    assert offsets(out.deliver) == list(range(10, 20)) and out.late == []


@pytest.mark.parametrize("position", [0, 3])
def test_records_written_before_a_partition_was_activated_are_strays(position: int) -> None:
    """Partition 1 was reserved until offset 7: what a plain producer wrote there before
    is a stray (forwarded, not applied); from 7 on only keys placed elsewhere are."""
    from assignors.linear_hashing import lh_bucket
    from assignors.murmur2 import key_hash

    lay = transitions.create("orders", 1, capacity=2, now_ms=0)
    lay = transitions.seal(transitions.expand(lay, 2, announce_offsets={0: 0, 1: 7}, now_ms=1), {0: 0, 1: 7})
    admission, consumer, route = make(lay, partition=1, position=position)
    admission.regate(lambda t: lay, lambda t: {0: 0})
    assert route.position == position  # not skipped: read to be forwarded
    keys = [f"k{i}".encode() for i in range(12)]
    tp1 = TopicPartition("orders", 1)
    [(_, out)] = admission.admit(tp1, [Rec("orders", 1, o, keys[o]) for o in range(position, 12)])
    mine = {o for o in range(7, 12) if lh_bucket(key_hash(keys[o]), 1, 2) == 1}
    assert offsets(out.deliver) == sorted(mine)
    assert offsets(out.strays) == [o for o in range(position, 12) if o not in mine]
    assert out.consumed == 12 - position and out.next_position == 12


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
    from streamkit.runtime.routes import SlotPlace, mixed_history_end

    layout = expanded()
    assert mixed_history_end(layout, 0) == 10 and mixed_history_end(layout, 1) == 0 and mixed_history_end(None, 0) == 0
    admission, _, old = make(layout, position=5)
    route = Route.for_slot(old.proc, old.handlers, ("orders", 0), 0, layout, SlotPlace(None, (), 1, 2))
    admission.routes[TP] = [route]
    keys = [f"k{i}".encode() for i in range(14)]
    [(_, out)] = admission.admit(TP, [Rec("orders", 0, o, keys[o], b"1", stamp(layout)) for o in range(5, 14)])
    assert offsets(out.deliver) == [o for o in range(5, 14) if o >= 10 or key_hash(keys[o]) % 2 == 0]
    route.position = out.next_position
    beyond = Route.for_slot(old.proc, old.handlers, ("orders", 0), 0, layout, SlotPlace(None, (), 1, 2))
    assert beyond.key_filter is None  # its position (14) is past the mixed history


def capacity_only() -> TopicLayout:
    """orders: 2 active partitions of 4, never expanded (a plain producer uses all 4)."""
    return transitions.create("orders", 2, capacity=4, now_ms=0)


def test_an_unstamped_record_of_a_key_the_layout_places_elsewhere_is_a_stray() -> None:
    from assignors.linear_hashing import lh_bucket
    from assignors.murmur2 import key_hash

    layout = capacity_only()
    admission, _, route = make(layout)
    keys = [f"k{i}".encode() for i in range(20)]
    batch = [Rec("orders", 0, o, keys[o]) for o in range(20)] + [Rec("orders", 0, 20, None)]
    [(_, out)] = admission.admit(TP, batch)
    placed = [o for o in range(20) if lh_bucket(key_hash(keys[o]), 2, 2) == 0]
    assert offsets(out.deliver) == [*placed, 20]  # a keyless record is in place on an active partition
    assert offsets(out.strays) == [o for o in range(20) if o not in placed] and out.strays
    # the same keys stamped by streamkit's producer: trusted, nothing hashed
    route.position = 0
    admission.routes[TP] = [Route.build(route.proc, route.handlers, ("orders", 0), 0, layout)]
    [(_, out)] = admission.admit(TP, [Rec("orders", 0, o, keys[o], b"1", stamp(layout)) for o in range(20)])
    assert offsets(out.deliver) == list(range(20)) and out.strays == []


def test_a_stray_beside_records_sharing_a_batch_stamp_is_found() -> None:
    """Records sharing their batch's stamp pass on an identity test; a record with headers
    of its own (a foreign producer's) or none is still checked, first in the batch or not."""
    from assignors.linear_hashing import lh_bucket
    from assignors.murmur2 import key_hash

    layout = capacity_only()
    admission, _, route = make(layout)
    keys = [f"k{i}".encode() for i in range(40)]
    elsewhere = [k for k in keys if lh_bucket(key_hash(k), 2, 2) != 0]
    shared = stamp(layout)
    foreign = (("trace", b"t1"),)
    batch = [Rec("orders", 0, 0, elsewhere[0], b"1", foreign)]  # first, with a header that is not a stamp
    batch += [Rec("orders", 0, o, elsewhere[o], b"1", shared) for o in range(1, 5)]
    batch += [Rec("orders", 0, 5, elsewhere[5])]  # unstamped, placed elsewhere
    [(_, out)] = admission.admit(TP, batch)
    assert offsets(out.strays) == [0, 5] and offsets(out.deliver) == [1, 2, 3, 4]
    route.position = 0
    admission.routes[TP] = [Route.build(route.proc, route.handlers, ("orders", 0), 0, layout)]
    batch = [Rec("orders", 0, o, elsewhere[o], b"1", shared) for o in range(4)] + [Rec("orders", 0, 4, elsewhere[4])]
    [(_, out)] = admission.admit(TP, batch)
    assert offsets(out.strays) == [4] and offsets(out.deliver) == [0, 1, 2, 3]


def test_a_plain_batch_of_known_keys_still_shows_a_new_stray_a_header_and_a_newer_epoch() -> None:
    """Once a plain producer's keys are known in place, a batch of them passes on one test
    per record; a misplaced key, a foreign header or a newer stamp among them is still seen."""
    from assignors.linear_hashing import lh_bucket
    from assignors.murmur2 import key_hash

    layout = capacity_only()
    admission, consumer, route = make(layout)
    keys = [f"k{i}".encode() for i in range(60)]
    mine = [k for k in keys if lh_bucket(key_hash(k), 2, 2) == 0]
    elsewhere = [k for k in keys if lh_bucket(key_hash(k), 2, 2) != 0]
    [(_, out)] = admission.admit(TP, [Rec("orders", 0, o, mine[o % 5]) for o in range(10)])  # learnt
    assert offsets(out.deliver) == list(range(10)) and out.strays == []
    route.position = out.next_position
    [(_, out)] = admission.admit(TP, [Rec("orders", 0, o, mine[o % 5]) for o in range(10, 20)])
    assert offsets(out.deliver) == list(range(10, 20)) and out.strays == []
    route.position = out.next_position
    batch = [Rec("orders", 0, o, mine[o % 5]) for o in range(20, 30)]
    batch[4] = Rec("orders", 0, 24, elsewhere[0])
    batch[6] = Rec("orders", 0, 26, elsewhere[1], b"1", (("trace", b"t1"),))
    [(_, out)] = admission.admit(TP, batch)
    assert offsets(out.strays) == [24, 26] and offsets(out.deliver) == [o for o in range(20, 30) if o not in (24, 26)]
    route.position = out.next_position
    newer = transitions.expand(layout, 3, now_ms=1)
    batch = [Rec("orders", 0, o, mine[o % 5]) for o in range(30, 35)]
    batch[3] = Rec("orders", 0, 33, mine[0], b"1", stamp(newer))
    [(_, out)] = admission.admit(TP, batch)
    assert offsets(out.deliver) == [30, 31, 32] and out.next_position == 33 and consumer.seeks[-1] == (TP, 33)
    assert admission.take_stale_epochs() == {"orders": newer.epoch}


def test_a_topic_never_changed_still_finds_what_librdkafkas_partitioner_misplaced() -> None:
    """Murmur2 modulo 3 places keys like the layout; CRC32 (confluent-kafka's default)
    puts some of them into partition 0 that linear hashing places elsewhere: strays."""
    import zlib

    from assignors.murmur2 import key_hash

    plain = transitions.create("orders", 3, capacity=3, now_ms=0)
    admission, _, route = make(plain)
    assert route.strays is not None
    keys = [f"k{i}".encode() for i in range(200)]
    crc_here = [k for k in keys if zlib.crc32(k) % 3 == 0][:10]
    batch = [Rec("orders", 0, o, k) for o, k in enumerate(crc_here)]
    [(_, out)] = admission.admit(TP, batch)
    misplaced = [o for o, k in enumerate(crc_here) if key_hash(k) % 3 != 0]
    assert misplaced and offsets(out.strays) == misplaced
    assert offsets(out.deliver) == [o for o in range(len(crc_here)) if o not in misplaced]


def test_a_swept_partition_forwards_everything_from_where_the_group_was() -> None:
    layout = capacity_only()
    admission, _, owner = make(layout)
    swept = Route.sweeping(owner.proc, owner.handlers, ("orders", 3), 4, layout)
    admission.routes = {TopicPartition("orders", 3): [swept]}
    assert swept.position == 4 and swept.swept
    admission.regate(lambda t: layout, lambda t: {})
    assert swept.limit is None  # no gate on a swept partition
    batch = [Rec("orders", 3, o, f"k{o}".encode()) for o in range(2, 9)] + [Rec("orders", 3, 9, None)]
    [(_, out)] = admission.admit(TopicPartition("orders", 3), batch)
    assert out.deliver == [] and out.rebuild == [] and offsets(out.strays) == [4, 5, 6, 7, 8, 9]


def test_a_second_copy_of_a_forwarded_stray_is_dropped_until_the_checkpoint_is_rewound() -> None:
    from streamkit.layout.strays import STRAY_HEADER

    layout = capacity_only()
    admission, _, route = make(layout)

    def copy(offset: int, origin: tuple[int, int]) -> Rec:
        headers = (*stamp(layout), (STRAY_HEADER, SEAL.seal("orders", *origin, b"k", b"1")))
        return Rec("orders", 0, offset, b"k", b"1", headers)

    batch = [copy(0, (3, 10)), copy(1, (3, 11)), copy(2, (2, 5)), copy(3, (3, 10)), copy(4, (3, 11)), copy(5, (3, 12))]
    [(_, out)] = admission.admit(TP, batch)
    assert offsets(out.deliver) == [0, 1, 2, 5] and admission.stray_check.stray_copies_dropped == 2
    route.position = out.next_position  # (what ``Task.apply`` does once the batch is applied)
    assert route.proc.checkpoint_extra({})["seen_strays"] == {"orders:3:0": 12, "orders:2:0": 5}
    route.proc.rewind()  # nothing checkpointed: after a restart the copies are new again
    route.position = 0
    [(_, out)] = admission.admit(TP, batch[:2])
    assert offsets(out.deliver) == [0, 1]


def test_a_copy_held_by_the_merge_when_its_processor_is_given_up_is_applied_after_it() -> None:
    """Admission marks a forwarded stray's copy as seen when it lets it through; the
    processor's time-ordered merge may hold it (pending) past a checkpoint. The checkpoint
    records the copies below its stable offsets only: read again from it (the processor was
    given up in a rebalance), the held copies are applied, not dropped as second copies of
    themselves (records lost, counted as duplicate strays)."""
    from streamkit.layout.strays import STRAY_HEADER

    layout = capacity_only()
    admission, _, route = make(layout)

    def copy(offset: int, origin: tuple[int, int]) -> Rec:
        headers = (*stamp(layout), (STRAY_HEADER, SEAL.seal("orders", *origin, b"k", b"1")))
        return Rec("orders", 0, offset, b"k", b"1", headers)

    batch = [copy(o, (3, 10 + o)) for o in range(5)]
    [(_, out)] = admission.admit(TP, batch)
    assert offsets(out.deliver) == [0, 1, 2, 3, 4]
    proc = route.proc
    proc.pending.setdefault(route.position_key, set()).update(range(5))  # held by the merge (``Task.apply``)
    route.position = out.next_position
    assert proc.stable()[0] == {route.position_key: 0} and "seen_strays" not in proc.checkpoint_extra({})
    proc.loaded = proc.loaded.replace(positions=proc.stable()[0], extra=proc.checkpoint_extra({}))  # given up
    proc.pending.clear()
    proc.rewind()
    [(_, out)] = admission.admit(TP, batch)  # read again from the checkpoint
    assert offsets(out.deliver) == [0, 1, 2, 3, 4] and admission.stray_check.stray_copies_dropped == 0
    route.position = out.next_position  # applied now: the next checkpoint has them
    assert proc.checkpoint_extra({})["seen_strays"] == {"orders:3:0": 14}
    [(_, out)] = admission.admit(TP, [copy(5, (3, 14))])
    assert out.deliver == [] and admission.stray_check.stray_copies_dropped == 1


def test_an_origin_header_streamkit_did_not_seal_drops_nothing() -> None:
    """A plain producer's ``streamkit.stray.from`` (or a copy mirrored from a cluster with
    another seal) is ordinary input: applied where it is in place, a stray where it is not,
    and it never makes the real copies of that origin look like duplicates."""
    from assignors.linear_hashing import lh_bucket
    from assignors.murmur2 import key_hash
    from streamkit.layout.strays import STRAY_HEADER

    layout = capacity_only()
    admission, _, route = make(layout)
    in_place = next(k for i in range(100) if lh_bucket(key_hash(k := f"k{i}".encode()), 2, 2) == 0)
    misplaced = next(k for i in range(100) if lh_bucket(key_hash(k := f"k{i}".encode()), 2, 2) != 0)
    other_cluster = OriginSeal(b"o" * 32).seal("orders", 3, 10, in_place, b"1")
    sealed_for_another_value = SEAL.seal("orders", 3, 10, in_place, b"1")
    forged = [
        Rec("orders", 0, 0, in_place, b"1", ((STRAY_HEADER, b"3:1000"),)),  # unstamped, in place: applied
        Rec("orders", 0, 1, in_place, b"1", (*stamp(layout), (STRAY_HEADER, b"3:1000"))),  # stamped: applied
        Rec("orders", 0, 2, misplaced, b"1", ((STRAY_HEADER, b"3:11"),)),  # unstamped, misplaced: a stray
        Rec("orders", 0, 3, in_place, b"1", (*stamp(layout), (STRAY_HEADER, other_cluster))),
        Rec("orders", 0, 4, in_place, b"2", (*stamp(layout), (STRAY_HEADER, sealed_for_another_value))),
    ]
    [(_, out)] = admission.admit(TP, forged)
    assert offsets(out.deliver) == [0, 1, 3, 4] and offsets(out.strays) == [2]
    assert admission.stray_check.stray_copies_dropped == 0 and admission.stray_check.unsealed_origins_by == {TP: 5}
    real = [
        Rec("orders", 0, o, b"k", b"1", (*stamp(layout), (STRAY_HEADER, SEAL.seal("orders", 3, origin, b"k", b"1"))))
        for o, origin in ((5, 10), (6, 11))
    ]
    route.position = 5
    [(_, out)] = admission.admit(TP, real)
    assert offsets(out.deliver) == [5, 6] and admission.stray_check.stray_copies_dropped == 0


def test_a_stray_in_a_shared_partition_is_taken_by_the_lowest_sharer() -> None:
    """A stray's key is in no sharer's key range (the layout places it elsewhere): the
    sharer that takes keyless records takes the strays, the other drops them."""
    from assignors.linear_hashing import lh_bucket
    from assignors.murmur2 import key_hash
    from assignors.placement import KeyFilter

    layout = capacity_only()
    admission, _, low = make(layout)
    high_proc = ProcessorState(1, MemoryStore(()), {})  # type: ignore[arg-type]
    high = Route.build(high_proc, low.handlers, ("orders", 0), 0, layout)
    low.key_filter, low.sharers = KeyFilter(4, frozenset({0})), (0, 1)
    high.key_filter, high.sharers, high.null_keys = KeyFilter(4, frozenset({2})), (0, 1), False
    admission.add(TP, high)
    keys = [f"k{i}".encode() for i in range(40)]
    taken = {route.proc.id: a for route, a in admission.admit(TP, [Rec("orders", 0, o, keys[o]) for o in range(40)])}
    strays = [o for o in range(40) if lh_bucket(key_hash(keys[o]), 2, 2) != 0]
    assert strays and offsets(taken[0].strays) == strays and taken[1].strays == []
    assert offsets(taken[0].deliver) == [o for o in range(40) if key_hash(keys[o]) % 4 == 0]
    assert offsets(taken[1].deliver) == [o for o in range(40) if key_hash(keys[o]) % 4 == 2]


def test_a_swept_partition_an_expansion_activates_forwards_only_what_lies_below_its_activation() -> None:
    layout = capacity_only()
    admission, consumer, owner = make(layout)
    tp3 = TopicPartition("orders", 3)
    swept = Route.sweeping(owner.proc, owner.handlers, ("orders", 3), 0, layout)
    admission.routes = {tp3: [swept]}
    lay3 = transitions.seal(transitions.expand(layout, 3, announce_offsets={0: 0, 1: 0, 2: 0}, now_ms=1), {0: 0, 1: 0})
    lay4 = transitions.expand(lay3, 4, announce_offsets={0: 0, 1: 0, 2: 0, 3: 6}, now_ms=2)  # announced, not sealed
    assert lay4.mode(3) != lay3.mode(3)
    admission.regate(lambda t: lay4, lambda t: {})
    assert swept.limit == 6 and tp3 not in consumer.paused
    [(_, out)] = admission.admit(tp3, [Rec("orders", 3, o, f"k{o}".encode()) for o in range(10)])
    assert offsets(out.strays) == list(range(6)) and out.next_position == 6 and tp3 in consumer.paused


def test_a_former_sharer_reads_its_keys_below_a_seal_while_the_next_change_is_announced() -> None:
    """orders: 1 partition shared by processors 0 and 1 (room for 3); expanded to 2
    (sealed at 1881: partition 1 now holds processor 1's keys), then the expansion to 3
    is announced. Processor 1, at 1750 in partition 0, must read its keys up to 1881 now:
    the gate of partition 1 looks at partition 0's new owner (processor 0), not at
    processor 1's keys. (Waiting for the second seal let partition 1 deliver first.)"""
    from streamkit.runtime.rebuild import plan_left_history

    lay = transitions.create("orders", 1, capacity=3, now_ms=0)
    lay = transitions.expand(lay, 2, announce_offsets={0: 1800, 1: 0}, now_ms=1)
    lay = transitions.seal(lay, {0: 1881, 1: 0})
    pending = transitions.expand(lay, 3, announce_offsets={0: 2900, 1: 900, 2: 0}, now_ms=2)
    positions = {("orders", 0): 1750, ("orders", 1): 0}

    def plan(layout: TopicLayout) -> dict[int, int]:
        left = plan_left_history(1, 2, 2, positions, {("orders", 1)}, {"orders": layout})
        return {tp.partition: end for tp, end in left.targets.items()}

    assert plan(lay) == {0: 1881} and plan(pending) == {0: 1881}
    positions[("orders", 0)] = 1881
    assert plan(pending) == {}
    assert plan(transitions.seal(pending, {0: 2999, 1: 950, 2: 0})) == {0: 2999}


def two_sharers(layout: TopicLayout, position: int) -> tuple[Admission, Route, Route]:
    """Partition 0 shared by processors 0 (even key hashes, keyless records) and 1 (odd)."""
    from assignors.placement import KeyFilter

    admission, _, even = make(layout, position=position)
    odd_proc = ProcessorState(1, MemoryStore(()), {})  # type: ignore[arg-type]
    odd_proc.positions[("orders", 0)] = position
    odd = Route.build(odd_proc, even.handlers, ("orders", 0), 0, layout)
    even.key_filter, even.sharers = KeyFilter(2, frozenset({0})), (0, 1)
    odd.key_filter, odd.sharers, odd.null_keys = KeyFilter(2, frozenset({1})), (0, 1), False
    admission.add(TP, odd)
    return admission, even, odd


def test_records_of_an_unknown_epoch_are_each_sharers_own_and_the_epoch_is_asked_again_later() -> None:
    """A record stamped with an epoch the registry did not reach is a dead letter of the
    sharer whose key it has, not of every sharer; after a while the epoch is asked again
    (a registry that was only slow)."""
    from assignors.murmur2 import key_hash

    layout = expanded()
    admission, even, odd = two_sharers(layout, position=20)
    keys = [f"k{i}".encode() for i in range(20, 26)]
    admission.unknown_epochs["orders"] = {layout.epoch + 5: time.monotonic() + 60}
    batch = [r for i, k in enumerate(keys) for r in recs([20 + i], epoch=layout.epoch + 5, key=k)]
    got = {route.proc.id: a for route, a in admission.admit(TP, batch)}
    for pid in (0, 1):
        assert [r.offset for r, reason, _ in got[pid].rejected] == [
            20 + i for i, k in enumerate(keys) if key_hash(k) % 2 == pid
        ]
        assert {reason for _, reason, _ in got[pid].rejected} == {"unknown-epoch"} and not got[pid].deliver
    even.position = odd.position = 20
    admission.unknown_epochs["orders"] = {layout.epoch + 5: time.monotonic() - 1}  # given up on long ago
    [(_, again), *_] = admission.admit(TP, batch)
    assert not again.rejected and again.next_position == 20 and even.stale_epoch == layout.epoch + 5


def test_a_batch_of_late_records_only_is_reported_by_the_sharer_owning_each_key() -> None:
    """Late records are each sharer's own to report, also when the whole batch is late
    (nothing to deliver): before, every sharer reported all of them (dead letters twice)."""
    from assignors.murmur2 import key_hash

    layout = expanded()
    admission, even, odd = two_sharers(layout, position=10)
    from assignors.linear_hashing import lh_bucket

    moved = [k for i in range(400) if lh_bucket(key_hash(k := f"k{i}".encode()), 1, 2) == 1][:6]
    batch = [r for i, k in enumerate(moved) for r in recs([10 + i], epoch=1, key=k)]
    got = {route.proc.id: a for route, a in admission.admit(TP, batch)}
    for pid in (0, 1):
        assert not got[pid].deliver
        assert [r.offset for r, _ in got[pid].late] == [10 + i for i, k in enumerate(moved) if key_hash(k) % 2 == pid]
