"""Between admission and dispatch: the records a processor with several input topics
must apply in time order go through the merge (``streamkit.joins.merge``), the rest
straight to the handlers. Used by the member's loop and by rebuilds alike."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from aiokafka import TopicPartition

from streamkit.joins.merge import Lagging, TimeMerge
from streamkit.runtime.admission import Admitted
from streamkit.runtime.dispatch import Dispatcher
from streamkit.runtime.restamp import restamp
from streamkit.runtime.routes import Route

__all__ = [
    "HELD_PER_TOPIC",
    "HeldBack",
    "apply_admitted",
    "apply_merged",
    "consumer_lagging",
    "merged_inputs",
    "release_merged",
]

HELD_PER_TOPIC = 20_000
"""Records the merge may hold for one processor from one topic before that topic's
partitions stop being fetched (Kafka Streams' ``buffered.records.per.partition``): a topic
far ahead in time while another catches up does not pile up in memory. Fetched again
once half of them went out."""


def _merged(route: Route) -> bool:
    """Key-concurrent routes run their own order; a swept partition delivers nothing."""
    return route.scheduler is None and not route.swept


def merged_inputs(routes: Iterable[tuple[TopicPartition, Route]]) -> Iterator[tuple[int, str]]:
    """The (processor, topic) pairs of ``routes`` that the merge orders."""
    return ((r.proc.id, tp.topic) for tp, r in routes if _merged(r))


async def apply_merged(
    merge: TimeMerge, dispatcher: Dispatcher, route: Route, admitted: Admitted, lagging: Lagging
) -> None:
    """Apply one partition batch: what the merge orders is held for it (unless nothing
    could come before it: ``TimeMerge.passes``); the rest (and the reports of late records
    and strays) goes to the handlers now. Records get their topic's time first."""
    restamp(route, admitted)
    if (
        (admitted.rebuild or admitted.deliver)
        and merge.merges(route)
        and _merged(route)
        and not merge.passes(route, time.monotonic(), lagging)
    ):
        merge.hold(route, admitted.rebuild, admitted.deliver)
        admitted.rebuild, admitted.deliver = [], []
    await dispatcher.apply(route, admitted)


async def apply_admitted(
    merge: TimeMerge, dispatcher: Dispatcher, route: Route, admitted: Admitted, lagging: Lagging
) -> None:
    """The apply step of every driver: apply one admitted partition batch
    (:func:`apply_merged`), move the route's position past it (what the merge holds or a
    key-concurrent handler queued is pending: applied later, checkpointed then) and count
    what the processor has not committed."""
    await apply_merged(merge, dispatcher, route, admitted, lagging)
    route.position = admitted.next_position
    route.proc.uncommitted += admitted.consumed


async def release_merged(merge: TimeMerge, dispatcher: Dispatcher, lagging: Lagging, *, flush: bool = False) -> int:
    """Apply what the merge releases now, in its order; returns how many records."""
    if not merge.held:
        return 0
    released = 0
    for route, rebuild, deliver in merge.release(time.monotonic(), lagging, flush):
        await dispatcher.apply(route, Admitted(rebuild, deliver, [], [], route.position, 0))
        released += len(rebuild) + len(deliver)
    return released


class HeldBack:
    """The partitions paused because the merge holds too many of their topic's records
    (``HELD_PER_TOPIC``)."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.paused: set[TopicPartition] = set()

    def update(self, merge: TimeMerge, routes: Iterable[tuple[TopicPartition, Route]]) -> None:
        """Pause the partitions of a (processor, topic) over the bound; let go of those
        under half of it, and of those no longer routed. ``consumer`` pauses for this
        reason only (``group_consumer.PauseControl``): a partition a gate holds stays
        paused until the gate lets go of it too."""
        most: dict[TopicPartition, int] = {}
        for tp, route in routes:
            if _merged(route):
                most[tp] = max(most.get(tp, 0), merge.queued(route.proc.id, tp.topic))
        for tp, n in most.items():
            if n > HELD_PER_TOPIC and tp not in self.paused:
                self.consumer.pause(tp)
                self.paused.add(tp)
            elif n <= HELD_PER_TOPIC // 2 and tp in self.paused:
                self.paused.discard(tp)
                self.consumer.resume(tp)
        if gone := self.paused - set(most):  # partitions no longer routed
            self.consumer.resume(*gone)
            self.paused -= gone

    def clear(self) -> None:
        self.paused.clear()


def consumer_lagging(
    consumer: Any, routes: Callable[[], Iterable[tuple[TopicPartition, Route]]], held_back: HeldBack | None = None
) -> Lagging:
    """``lagging`` for a member: a topic lags for a processor when one of its partitions
    there has records beyond the route's position by the last high watermark a fetch
    reported (or none was reported yet). A partition paused by its gate, or a route at
    its gate's limit, does not lag: it brings nothing until the gate opens (one paused
    for holding too much, ``HeldBack``, does).

    The route's position, not the consumer's: aiokafka moves its position over records it
    has fetched and not yet handed over. (A partition ending in a transaction marker keeps
    its position below the high watermark: such a topic is passed over after
    ``LAG_WAIT_SECONDS`` each time.)"""

    def lagging(pid: int, topic: str) -> bool:
        paused = consumer.paused() - (held_back.paused if held_back is not None else set())
        for tp, route in routes():
            if tp.topic != topic or route.proc.id != pid or not _merged(route) or tp in paused:
                continue
            if route.limit is not None and route.position >= route.limit:
                continue
            try:
                high = consumer.highwater(tp)
            except AssertionError:  # no longer assigned
                continue
            if high is None or high > route.position:
                return True
        return False

    return lagging
