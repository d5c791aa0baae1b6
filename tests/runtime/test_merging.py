"""What the member does around the time-ordered merge: back-pressure (``HeldBack``) and
which partitions lag, on plain objects (pure logic; the joins' worker tests run it)."""

from __future__ import annotations

from aiokafka import TopicPartition

from streamkit.joins.merge import TimeMerge
from streamkit.runtime.merging import HELD_PER_TOPIC, HeldBack, consumer_lagging
from tests.joins.merge_fakes import FakeRoute, Proc, Rec


class Consumer:
    def __init__(self) -> None:
        self._paused: set[TopicPartition] = set()
        self.high: dict[TopicPartition, int | None] = {}

    def pause(self, tp: TopicPartition) -> None:
        self._paused.add(tp)

    def resume(self, tp: TopicPartition) -> None:
        self._paused.discard(tp)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.high.get(tp)


def test_a_topic_held_past_the_bound_stops_being_fetched_until_half_went_out() -> None:
    proc, consumer = Proc(0), Consumer()
    a, b = FakeRoute(proc, ("a", 0)), FakeRoute(proc, ("b", 0))
    routes = [(TopicPartition("a", 0), a), (TopicPartition("b", 0), b)]
    merge = TimeMerge(0)
    merge.set_inputs([(0, "a"), (0, "b")])
    held = HeldBack(consumer)
    merge.hold(a, [], [Rec("a", 0, i, 1000 + i) for i in range(HELD_PER_TOPIC + 1)])
    held.update(merge, routes)
    assert consumer.paused() == {TopicPartition("a", 0)}
    # paused for holding too much, a still lags (it has records): b's wait for it stands
    lagging = consumer_lagging(consumer, lambda: routes, held)
    consumer.high[TopicPartition("a", 0)] = 10**9
    assert lagging(0, "a")
    merge.hold(b, [], [Rec("b", 0, 0, 10**9)])
    merge.release(0.0, lambda *_: False)  # a's records go out, up to b's head
    held.update(merge, routes)
    assert consumer.paused() == set() and held.paused == set()


def test_a_partition_its_gate_paused_is_not_resumed_by_the_merge() -> None:
    proc, consumer = Proc(0), Consumer()
    a = FakeRoute(proc, ("a", 0), position=5, limit=5)
    routes = [(TopicPartition("a", 0), a), (TopicPartition("b", 0), FakeRoute(proc, ("b", 0)))]
    merge = TimeMerge(0)
    merge.set_inputs([(0, "a"), (0, "b")])
    held = HeldBack(consumer)
    held.paused.add(TopicPartition("a", 0))
    consumer.pause(TopicPartition("a", 0))  # (the gate's pause too)
    held.update(merge, routes)
    assert held.paused == set() and consumer.paused() == {TopicPartition("a", 0)}
    # and a partition at its gate's limit does not lag
    consumer.high[TopicPartition("a", 0)] = 9
    assert not consumer_lagging(consumer, lambda: routes, held)(0, "a")
