"""What the time-ordered merge (``streamkit.joins.merge``) of a task's input topics
needs from the runtime around it: which routes it orders, when a topic lags (live), and
the consumer's pauses for its back-pressure. The apply step that holds and releases
records is the task's (``task.Task``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from aiokafka import TopicPartition

from streamkit.joins.merge import Lagging, Source
from streamkit.runtime.routes import Route

__all__ = ["HELD_PER_PARTITION", "HeldBack", "consumer_lagging", "merged", "merged_inputs"]

HELD_PER_PARTITION = 20_000
"""Records the merge may hold for one processor from one partition before the partition
stops being fetched (Kafka Streams' ``buffered.records.per.partition``): a partition far
ahead in time while another catches up does not pile up in memory. Fetched again once
half of them went out."""


def merged(route: Route) -> bool:
    """Key-concurrent routes run their own order; a swept partition delivers nothing."""
    return route.scheduler is None and not route.swept


def merged_inputs(routes: Iterable[tuple[TopicPartition, Route]]) -> Iterator[tuple[int, Source]]:
    """The (processor, source) pairs of ``routes`` that the merge orders."""
    return ((r.proc.id, r.position_key) for _, r in routes if merged(r))


class HeldBack:
    """The partitions paused because a task's merge holds too many of their topic's
    records (``Task.back_pressure``): the union of what the member's tasks ask for."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.paused: set[TopicPartition] = set()

    def update(self, wanted: set[TopicPartition]) -> None:
        """Pause ``wanted``, let go of the rest. ``consumer`` pauses for this reason only
        (``group_consumer.PauseControl``): a partition a gate holds stays paused until the
        gate lets go of it too."""
        if more := wanted - self.paused:
            self.consumer.pause(*more)
        if gone := self.paused - wanted:
            self.consumer.resume(*gone)
        self.paused = set(wanted)

    def clear(self) -> None:
        self.paused.clear()


def consumer_lagging(
    consumer: Any, routes: Callable[[], Iterable[tuple[TopicPartition, Route]]], held_back: HeldBack | None = None
) -> Lagging:
    """``lagging`` for a member: a partition lags for a processor when it has records
    beyond the route's position by the last high watermark a fetch reported (or none was
    reported yet). A partition paused by its gate, or a route at its gate's limit, does
    not lag: it brings nothing until the gate opens. One paused for another reason (for
    holding too much, ``HeldBack``, or while a bootstrap's final stretch holds its owner,
    ``scale.joining.OwnerHold``) lags whatever its last high watermark said: no fetch
    refreshes that while it is paused, and records written since would come after the
    others' later ones.

    The route's position moves with the records applied; offsets that hold no record (a
    transaction's commit marker, the last offset of a partition a transactional producer
    wrote) move the consumer's only (``GroupConsumer.quiet_at``): a partition lags only
    beyond both, so a merge never waits for what will never come, and waits as long as it
    takes for what will, as Kafka Streams' tasks do (KIP-695)."""

    def lagging(pid: int, source: Source) -> bool:
        paused = consumer.paused()
        if hasattr(consumer, "gated"):  # (paused by reason: a gate's hold, whatever else holds it too)
            gated = consumer.gated()
        else:  # a plain consumer's pauses: the gates', and those held back
            gated = paused - (held_back.paused if held_back is not None else set())
        for tp, route in routes():
            if route.position_key != source or route.proc.id != pid or not merged(route) or tp in gated:
                continue
            if route.limit is not None and route.position >= route.limit:
                continue
            if tp in paused:
                return True
            try:
                high = consumer.highwater(tp)
            except AssertionError:  # no longer assigned
                continue
            if high is None:
                return True
            quiet_at = consumer.quiet_at(tp) if hasattr(consumer, "quiet_at") else None
            if high > max(route.position, quiet_at if quiet_at is not None else -1):
                return True
        return False

    return lagging
