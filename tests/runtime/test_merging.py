"""What the runtime does around a task's time-ordered merge: back-pressure (the task
decides, ``Task.back_pressure``; the member's ``HeldBack`` pauses) and which partitions
lag, on plain objects (pure logic; the joins' worker tests run it)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import TopicPartition

from streamkit.joins.merge import TimeMerge
from streamkit.runtime.merging import HELD_PER_PARTITION, HeldBack, consumer_lagging
from streamkit.runtime.task import Task, apply_fetched
from tests.joins.merge_fakes import FakeRoute, Proc, Rec


def task_of(proc: Proc, merge: TimeMerge, routes: list[tuple[TopicPartition, Any]]) -> Task:
    """A task over plain stand-ins: only its merge and routes are read here."""
    task = Task(proc, None, merge)  # type: ignore[arg-type]
    task.routes.update(routes)
    return task


class Consumer:
    def __init__(self) -> None:
        self._paused: set[TopicPartition] = set()
        self.high: dict[TopicPartition, int | None] = {}
        self.quiet: dict[TopicPartition, int] = {}

    def pause(self, *tps: TopicPartition) -> None:
        self._paused.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self._paused.difference_update(tps)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.high.get(tp)

    def quiet_at(self, tp: TopicPartition) -> int | None:
        return self.quiet.get(tp)


def test_a_topic_held_past_the_bound_stops_being_fetched_until_half_went_out() -> None:
    proc, consumer = Proc(0), Consumer()
    a, b = FakeRoute(proc, ("a", 0)), FakeRoute(proc, ("b", 0))
    routes = [(TopicPartition("a", 0), a), (TopicPartition("b", 0), b)]
    merge = TimeMerge(0)
    merge.set_inputs([(0, ("a", 0)), (0, ("b", 0))])
    task = task_of(proc, merge, routes)
    held = HeldBack(consumer)
    merge.hold(a, [], [Rec("a", 0, i, 1000 + i) for i in range(HELD_PER_PARTITION + 1)])
    held.update(task.back_pressure())
    assert consumer.paused() == {TopicPartition("a", 0)}
    # paused for holding too much, a still lags (it has records): b's wait for it stands
    lagging = consumer_lagging(consumer, lambda: routes, held)
    consumer.high[TopicPartition("a", 0)] = 10**9
    assert lagging(0, ("a", 0))
    merge.hold(b, [], [Rec("b", 0, 0, 10**9)])
    merge.release(0.0, lambda *_: False)  # a's records go out, up to b's head
    held.update(task.back_pressure())
    assert consumer.paused() == set() and held.paused == set()


def test_the_bound_holds_between_half_and_full_and_a_task_lets_go_only_under_half() -> None:
    proc = Proc(0)
    a, b = FakeRoute(proc, ("a", 0)), FakeRoute(proc, ("b", 0))
    merge = TimeMerge(0)
    merge.set_inputs([(0, ("a", 0)), (0, ("b", 0))])
    task = task_of(proc, merge, [(TopicPartition("a", 0), a), (TopicPartition("b", 0), b)])
    merge.hold(a, [], [Rec("a", 0, i, 1000 + i) for i in range(HELD_PER_PARTITION // 2 + 1)])
    assert task.back_pressure() == set()  # under the bound: fetched
    merge.hold(a, [], [Rec("a", 0, i, 10**6 + i) for i in range(HELD_PER_PARTITION // 2)])
    assert task.back_pressure() == {TopicPartition("a", 0)}  # over it: paused
    b_lags = lambda _pid, source: source == ("b", 0)  # noqa: E731 - b has more to bring: a waits once b is empty
    merge.hold(b, [], [Rec("b", 0, 0, 1100)])
    merge.release(0.0, b_lags)  # a's 100 records before b's head go out
    assert HELD_PER_PARTITION // 2 < merge.queued(0, ("a", 0)) <= HELD_PER_PARTITION
    assert task.back_pressure() == {TopicPartition("a", 0)}  # between half and the bound: still paused
    merge.hold(b, [], [Rec("b", 0, 1, 10**6 + HELD_PER_PARTITION // 4)])
    merge.release(0.0, b_lags)
    assert merge.queued(0, ("a", 0)) <= HELD_PER_PARTITION // 2
    assert task.back_pressure() == set()  # under half: fetched again


def test_a_partition_its_gate_paused_is_not_resumed_by_the_merge_and_the_merge_lets_go_of_its_own() -> None:
    """The member's consumer pauses by reason (``group_consumer``): the merge letting go of
    a partition leaves it paused while its gate holds it, and a partition the merge held
    when its route went away is let go of too (before, the gate's check kept the merge's
    pause for ever)."""
    from streamkit.runtime.group_consumer import GATE, HELD
    from tests.runtime.test_group_consumer import consumer as group_consumer

    async def made() -> Any:
        return group_consumer()

    gc, fake = asyncio.run(made())
    fake.highwater = lambda tp: 9  # type: ignore[attr-defined]
    a, b, c = TopicPartition("a", 0), TopicPartition("b", 0), TopicPartition("c", 0)
    proc = Proc(0)
    routes = [(a, FakeRoute(proc, ("a", 0), position=5, limit=5)), (b, FakeRoute(proc, ("b", 0)))]
    merge = TimeMerge(0)
    merge.set_inputs([(0, ("a", 0)), (0, ("b", 0))])
    task = task_of(proc, merge, routes)
    held = HeldBack(gc.control(HELD))
    gc.control(GATE).pause(a)
    gc.control(HELD).pause(a, c)
    held.paused.update({a, c})  # c: held when its route went away
    held.update(task.back_pressure())
    assert held.paused == set() and gc.paused() == {a} and fake.paused == {a}
    gc.control(GATE).resume(a)
    assert fake.paused == set()
    # and a partition at its gate's limit does not lag
    gc.control(GATE).pause(a)
    assert not consumer_lagging(gc, lambda: routes, held)(0, ("a", 0))


def test_a_partition_paused_for_another_reason_than_its_gate_lags_whatever_its_last_high_watermark() -> None:
    """No fetch refreshes a paused partition's high watermark: read up to it, the partition
    may have seconds of records since. Paused while a bootstrap's final stretch holds its
    owner, it lags; paused by its gate, it does not (it brings nothing until the gate
    opens)."""
    from streamkit.runtime.group_consumer import GATE
    from tests.runtime.test_group_consumer import consumer as group_consumer

    async def made() -> Any:
        return group_consumer()

    gc, fake = asyncio.run(made())
    fake.highwater = lambda tp: 5  # type: ignore[attr-defined]
    a = TopicPartition("a", 0)
    routes = [(a, FakeRoute(Proc(0), ("a", 0), position=5))]
    lagging = consumer_lagging(gc, lambda: routes, HeldBack(gc.control("held")))
    assert not lagging(0, ("a", 0))  # read to its high watermark, fetched
    final_stretch = gc.control("a bootstrap's final stretch")
    final_stretch.pause(a)
    assert lagging(0, ("a", 0))
    gc.control(GATE).pause(a)
    assert not lagging(0, ("a", 0))  # its gate holds it too: nothing comes until it opens
    gc.control(GATE).resume(a)
    final_stretch.resume(a)
    assert not lagging(0, ("a", 0))


def test_offsets_that_hold_no_record_are_not_waited_for() -> None:
    """A partition a transactional producer wrote ends in a commit marker: the high
    watermark stays one beyond the last record, and only the consumer's position (handed
    over to, ``GroupConsumer.quiet_at``) passes it. Records handed over but not applied
    yet (later in the same fetch answer) still lag: no quiet position is noted for them."""
    proc, consumer = Proc(0), Consumer()
    a, b = FakeRoute(proc, ("a", 0), position=5), FakeRoute(proc, ("b", 0), position=0)
    routes = [(TopicPartition("a", 0), a), (TopicPartition("b", 0), b)]
    lagging = consumer_lagging(consumer, lambda: routes)
    consumer.high[TopicPartition("a", 0)] = 6
    assert lagging(0, ("a", 0))  # offset 5 not handed over: a record, or a marker
    consumer.quiet[TopicPartition("a", 0)] = 5
    assert lagging(0, ("a", 0))  # the client stands before it: it may be a record
    consumer.quiet[TopicPartition("a", 0)] = 6
    assert not lagging(0, ("a", 0))  # handed over, and no record came of it: a marker
    consumer.high[TopicPartition("a", 0)] = 7
    assert lagging(0, ("a", 0))  # a record written since


def test_a_partition_another_task_waits_for_is_not_paused_for_holding_too_much() -> None:
    """Two processors share partition a. Processor 0 holds too many of a's records while
    b lags; processor 1 holds c's records and waits for a. Pausing a for 0's sake would
    hold 1 until 0 lets go, and 0 may wait on 1 in turn: a is fetched on."""
    consumer = Consumer()
    p0, p1 = Proc(0), Proc(1)
    a0, b0, a1, c1 = (FakeRoute(p0, ("a", 0)), FakeRoute(p0, ("b", 0)), FakeRoute(p1, ("a", 0)),
                      FakeRoute(p1, ("c", 0)))  # fmt: skip
    tpa, tpb, tpc = TopicPartition("a", 0), TopicPartition("b", 0), TopicPartition("c", 0)
    merge0, merge1 = TimeMerge(0), TimeMerge(0)
    task0, task1 = task_of(p0, merge0, [(tpa, a0), (tpb, b0)]), task_of(p1, merge1, [(tpa, a1), (tpc, c1)])
    merge0.set_inputs([(0, ("a", 0)), (0, ("b", 0))])
    merge1.set_inputs([(1, ("a", 0)), (1, ("c", 0))])
    task0.lagging = task1.lagging = lambda *_: True  # b lags for 0, a for 1: nothing goes out
    merge0.hold(a0, [], [Rec("a", 0, i, 1000 + i) for i in range(HELD_PER_PARTITION + 1)])
    held = HeldBack(consumer)

    def fetch_answer() -> set[TopicPartition]:
        _, wanted = asyncio.run(apply_fetched(None, {0: task0, 1: task1}, {}))  # type: ignore[arg-type]
        held.update(wanted)
        return consumer.paused()

    assert fetch_answer() == {tpa}  # nobody else waits for a: paused
    merge1.hold(c1, [], [Rec("c", 0, 0, 5)])
    assert fetch_answer() == set()  # processor 1 waits for a: fetched again
