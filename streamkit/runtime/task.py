"""A task: one hosted processor as the runtime drives it (Kafka Streams' ``StreamTask``).

A task owns what is one processor's: its state (``ProcessorState``: stores, positions,
stream time), the routes of the partitions it reads, its time-ordered merge of several
input topics (``joins.merge.TimeMerge``) with the back-pressure that merge calls for, and
its checkpoint record. Three drivers run the same task, each fetching in its own way and
admitting each partition batch with the worker's ``Admission`` (a partition is fetched
once and admitted per route, so admission stays with the driver):

- the member's loop (``member``), live, under the task manager (``tasks``);
- the history reader (``rebuild``): rebuilds, bootstraps, seeds and left history;
- the test driver (``streamkit.testdriver``).

Per fetch answer a driver calls :meth:`Task.apply` for each admitted route batch, then
:meth:`Task.after_batch` (both in :func:`apply_fetched`, the live loop's and the test
driver's step; the history reader, which fetches a partition at a time, calls them
itself); it checkpoints with :meth:`Task.checkpoint_record` and
:meth:`Task.commit` (the member's commit sequence, ``checkpointing``, builds the same
record through :meth:`Task.checkpoint_record` for every task at once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition

from stores.base import Checkpoint
from streamkit.exactly_once.reader import CommitGate, without_markers
from streamkit.joins.merge import Lagging, Source, TimeMerge
from streamkit.runtime.admission import Admission, Admitted
from streamkit.runtime.dispatch import Dispatcher
from streamkit.runtime.merging import HELD_PER_PARTITION, merged, merged_inputs
from streamkit.runtime.processor import Position, ProcessorState
from streamkit.runtime.restamp import restamp
from streamkit.runtime.routes import Route, rebuilt_all

log = logging.getLogger(__name__)

__all__ = ["Task", "TaskView", "apply_fetched", "nothing_lags"]


def nothing_lags(pid: int, source: Source) -> bool:
    """Every record of every input is there already (a driver over lists): no input of
    the merge waits for more."""
    return False


@dataclass(frozen=True)
class TaskView:
    """What a task is now, read-only (status, metrics, tests)."""

    processor: int
    partitions: tuple[tuple[str, int], ...]
    positions: Mapping[Position, int]
    stream_time: int
    held: int
    """Records its time-ordered merge holds."""
    serving: bool
    """Caught up with the group on every partition (it runs timers)."""


class Task:
    """One hosted processor (see the module docstring).

    ``merge``: its time-ordered merge (live: ``max_task_idle_ms``; a history reader's
    waits for nothing but its exact lag). ``lagging``: whether one of its topics has
    records no fetch brought yet, as the driver knows it (the consumer's high
    watermarks live; the read targets of a history)."""

    def __init__(
        self, proc: ProcessorState, dispatcher: Dispatcher, merge: TimeMerge, lagging: Lagging = nothing_lags
    ) -> None:
        self.proc = proc
        self.dispatcher = dispatcher
        self.merge = merge
        if dispatcher is not None and dispatcher.output.writers is not None and proc.commit_gate is None:
            proc.commit_gate = CommitGate(proc.loaded.extra)  # processing="exactly_once"
        self.lagging = self.gated(lagging)
        self.routes: dict[TopicPartition, Route] = {}
        self.concurrent: list[Route] = []
        """The routes of key-concurrent handlers (their queued records run after a batch)."""
        self.holding: set[TopicPartition] = set()
        """Partitions the merge holds too many records of (``back_pressure``)."""

    def gated(self, lagging: Lagging, undecided: Collection[tuple[str, int]] = ()) -> Lagging:
        """``lagging``, and a partition whose records the commit gate holds lags too (unless
        it is ``undecided``: nothing will decide them in this read)."""
        if (gate := self.proc.commit_gate) is None:
            return lagging
        return lambda pid, source: (gate.holds(source) and source not in undecided) or lagging(pid, source)

    @property
    def id(self) -> int:
        return self.proc.id

    # -- what it reads -----------------------------------------------------------------------
    def read(self, tp: TopicPartition, route: Route) -> None:
        """Read ``tp`` through ``route`` (the driver admits for it)."""
        assert route.proc is self.proc and tp not in self.routes, "one route per partition, of this processor"
        self.routes[tp] = route
        if route.scheduler is not None:
            self.concurrent.append(route)
        self.merge.set_inputs(merged_inputs(self.routes.items()))

    def let_go(self) -> list[Route]:
        """Stop reading every partition: its routes (to take out of admission) and what its
        merge holds go; its positions go back to its checkpoint (:meth:`rewind`), which has
        what was held pending: fetched again by whoever reads them next."""
        routes = list(self.routes.values())
        self.routes.clear()
        self.concurrent.clear()
        self.merge.clear()
        self.holding.clear()
        self.proc.rewind()
        return routes

    # -- per batch ---------------------------------------------------------------------------
    async def apply(self, route: Route, admitted: Admitted) -> None:
        """The apply step of every driver: one admitted partition batch (records get their
        topic's time first). What the merge orders is held for it (unless nothing could
        come before it: ``TimeMerge.passes``); the rest, and the reports of late records
        and strays, goes to the handlers now. The route's position moves past the batch
        (what the merge holds or a key-concurrent handler queued is pending: applied later,
        checkpointed then) and the records count as not committed. Exactly-once markers go
        no further; with ``processing="exactly_once"`` the records go through the
        processor's commit gate first (``exactly_once.reader``)."""
        if (gate := self.proc.commit_gate) is not None:
            self._through_gate(gate, route, admitted)
        else:
            admitted.rebuild, admitted.deliver = without_markers(admitted.rebuild), without_markers(admitted.deliver)
        restamp(route, admitted)
        merge = self.merge
        if (
            (admitted.rebuild or admitted.deliver)
            and merge.merges(route)
            and merged(route)
            and not merge.passes(route, time.monotonic(), self.lagging)
        ):
            merge.hold(route, admitted.rebuild, admitted.deliver)
            admitted.rebuild, admitted.deliver = [], []
        await self.dispatcher.apply(route, admitted)
        route.position = admitted.next_position
        self.proc.uncommitted += admitted.consumed

    def _through_gate(self, gate: CommitGate, route: Route, admitted: Admitted) -> None:
        """The batch through the commit gate: what it releases takes the batch's place;
        what it queues is pending (what it let go of no longer: the merge or a
        key-concurrent handler's queue, which shares the pending set, takes it on)."""
        source = route.position_key
        if not admitted.rebuild and not admitted.deliver and not gate.holds(source):
            return
        dropped = gate.dropped
        admitted.rebuild, admitted.deliver, freed = gate.admit(source, admitted.rebuild, admitted.deliver)
        pending = self.proc.pending.setdefault(source, set())
        pending.difference_update(freed)
        if gate.holds(source):
            pending.update(gate.held(source))
        if gate.dropped > dropped:
            log.info("processor %d: %s[%d]: dropped %d records of aborted attempts (their writer crashed or was "
                     "replaced before committing them)", self.id, *source, gate.dropped - dropped)  # fmt: skip

    async def release(self, *, flush: bool = False) -> int:
        """Apply what the merge releases now, in its order (``flush``: all it holds, waiting
        for nothing); returns how many records."""
        merge = self.merge
        if not merge.held:
            return 0
        released = 0
        for run in merge.release(time.monotonic(), self.lagging, flush):
            route, rebuild, deliver = run
            await self.dispatcher.apply(route, Admitted(rebuild, deliver, [], [], route.position, 0))
            merge.applied(run)
            released += len(rebuild) + len(deliver)
        return released

    async def after_batch(self) -> None:
        """After a fetch's batches: what the merge releases, going live once caught up (a
        shrink's merged processor), then the queued records of busy keys."""
        if self.merge.held:
            await self.release()
        if self.proc.sides is not None:
            await self.go_live_if_caught_up()
        for route in self.concurrent:
            if route.scheduler is not None and route.scheduler.queued:
                await self.dispatcher.run_queued(route)

    async def go_live_if_caught_up(self) -> None:
        """A shrink's merged processor (``sides``) goes live once none of its partitions
        has records left that the group handled already (``rebuild_until``), none held by
        the merge or a key-concurrent handler either (``stable``): before, each key set
        closes on its own stream time, as its old owner did, without output. Live, its key
        sets become one once none of its inputs lags (``SideClocks.may_merge``)."""
        if self.proc.sides is not None and rebuilt_all(self.proc, self.routes.items()):
            drained = not self.merge.held and not any(
                self.lagging(self.id, source) for source in {r.position_key for r in self.routes.values()}
            )
            await self.dispatcher.go_live(self.proc, drained=drained)

    async def adopt_stream_time(self, stream_time: int) -> int:
        """Go on from the stream time the keys' old owner had at the handover, its closes
        recorded as sent (``Dispatcher.adopt_stream_time``); how many."""
        return await self.dispatcher.adopt_stream_time(self.proc, stream_time)

    async def tick_wall(self, now_ms: int) -> int:
        """``close_on="wall"``: stream time moves up to ``now_ms`` and the closes that makes
        due are sent (``Dispatcher.tick_wall``); how many."""
        return await self.dispatcher.tick_wall([self.proc], now_ms)

    def back_pressure(self) -> set[TopicPartition]:
        """The partitions to stop fetching: those the merge holds more than
        ``HELD_PER_PARTITION`` records of, until it holds half of them (Kafka Streams'
        ``buffered.records.per.partition``)."""
        if not self.merge.held and not self.holding:
            return self.holding
        for tp, route in self.routes.items():
            if merged(route):
                n = self.merge.queued(self.id, route.position_key)
                if n > HELD_PER_PARTITION:
                    self.holding.add(tp)
                elif n <= HELD_PER_PARTITION // 2:
                    self.holding.discard(tp)
        return self.holding

    def starved(self) -> set[TopicPartition]:
        """The merged partitions this task's merge holds none of: while it holds others,
        it may be waiting for these."""
        merge = self.merge
        return {
            tp
            for tp, route in self.routes.items()
            if merged(route) and merge.merges(route) and not merge.queued(self.id, route.position_key)
        }

    def serving(self) -> bool:
        """Caught up with the group on every partition (a task still rebuilding its state
        runs no timer: its state is incomplete)."""
        return all(r.position >= r.rebuild_until for r in self.routes.values())

    # -- checkpoints -------------------------------------------------------------------------
    def checkpoint_record(self, epochs: Mapping[str, int], generation: int, extra: Mapping[str, Any]) -> Checkpoint:
        """The checkpoint of what is applied now: per partition the stable offset and the
        IC ranges beyond it, the stamp, and ``extra`` as this processor's checkpoints carry
        it (``ProcessorState.checkpoint_extra``)."""
        positions, ranges = self.proc.stable()
        return Checkpoint(
            positions=positions,
            layout_epochs=dict(epochs),
            generation=generation,
            ic_ranges=ranges,
            extra=self.proc.checkpoint_extra(extra, positions, ranges),
        )

    def commit(self, checkpoint: Checkpoint) -> None:
        """Write the changes the tables hold and ``checkpoint`` in one atomic store batch."""
        self.proc.commit(checkpoint)

    def rewind(self) -> None:
        """Forget what was applied since the last checkpoint (``ProcessorState.rewind``)."""
        self.proc.rewind()

    def close(self, *, discard: bool = False) -> None:
        """Close the store (``discard``: its changes since the last checkpoint first)."""
        self.merge.clear()
        if discard:
            self.proc.discard()
        self.proc.close()

    def view(self) -> TaskView:
        return TaskView(
            self.id,
            tuple((tp.topic, tp.partition) for tp in self.routes),
            dict(self.proc.positions),
            self.proc.stream_time,
            self.merge.held,
            self.serving(),
        )


async def apply_fetched(
    admission: Admission, tasks: Mapping[int, Task], fetched: Mapping[TopicPartition, list[Any]]
) -> tuple[int, set[TopicPartition]]:
    """One fetch answer: each partition's records admitted per route and applied by the
    route's task, then each task's end of batch. Returns the records taken off the answer
    and the partitions the tasks' back-pressure asks to stop fetching: not one that
    another task's merge waits for (a partition two processors share), which would wait
    on the first task's merge, perhaps while that one waits on the second's."""
    consumed = 0
    for tp, records in fetched.items():
        for route, admitted in admission.admit(tp, records):
            await tasks[route.proc.id].apply(route, admitted)
            consumed += admitted.consumed
    held: set[TopicPartition] = set()
    for task in tasks.values():
        await task.after_batch()
        if task.merge.held or task.holding:
            held |= task.back_pressure()
    if held:
        held -= {tp for task in tasks.values() if task.merge.held for tp in task.starved()}
    return consumed, held
