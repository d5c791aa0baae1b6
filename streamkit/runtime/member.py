"""A group member: one consumer's loop over the processors it hosts.

The loop fetches, hands each partition batch to admission and the apply step, and
decides when to gate again, tick the wall clock and checkpoint. What it hosts and their
lifecycle (assign, revoke, open, close, checkpoint) is the task manager's
(``tasks.TaskManager``); a scale change's next step is ``scale.joining``'s; the consumer
is ``group_consumer.GroupConsumer`` (the only user of aiokafka's private API). Turning an
assignment's slots into routes is routing's (``routing.Router``), what may be applied of
a fetch answer is admission's (``admission.Admission``), applying it is dispatch's
(``dispatch.Dispatcher``), and the commit sequence is ``checkpointing.checkpoint``'s.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aiokafka import ConsumerRebalanceListener, TopicPartition

from assignors.group import MemberInfo, StreamkitAssignor
from streamkit.app import App
from streamkit.errors import AssignmentError
from streamkit.layout.model import TopicLayout
from streamkit.runtime import collector
from streamkit.runtime.admission import Admission
from streamkit.runtime.catchup import CatchUp, shape_of
from streamkit.runtime.dispatch import Dispatcher, by_processor
from streamkit.runtime.epochs import catch_up_epochs
from streamkit.runtime.group_consumer import GATE, HELD, GroupConsumer
from streamkit.runtime.jobmeta import JobLayout
from streamkit.runtime.merging import HeldBack, consumer_lagging
from streamkit.runtime.parts import MemberParts
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.routing import Router
from streamkit.runtime.scale.joining import Joining
from streamkit.runtime.services import Services
from streamkit.runtime.task import apply_fetched
from streamkit.runtime.tasks import TaskManager

log = logging.getLogger(__name__)

GATE_POLL_SECONDS = 0.1
WALL_TICK_SECONDS = 0.5
"""With ``close_on="wall"``: how often the wall clock moves the processors' stream time."""


class _Listener(ConsumerRebalanceListener):
    """The member's side of a rebalance. The client only logs what its listener raises and
    goes on, which would leave a worker alive that hosts or applies nothing: an error here
    is the member's ``fatal``, which its loop raises (the worker stops with one line)."""

    def __init__(self, member: GroupMember) -> None:
        self.member = member

    async def on_partitions_revoked(self, revoked: Any) -> None:
        try:
            await self.member.tasks.release_all()
        except Exception as exc:
            self._fail("giving up its partitions", exc)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        try:
            await self.member.tasks.take_assignment(self.member.joining.host_for)
        except Exception as exc:
            self._fail("taking its partitions", exc)

    def _fail(self, doing: str, exc: Exception) -> None:
        log.exception("%s: %s failed", self.member.name, doing)
        if self.member.tasks.fatal is None:
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.member.tasks.fatal = AssignmentError(f"{self.member.name}: {doing} failed, so it stops: {why}")


class GroupMember:
    """One consumer of the group and the loop over what it hosts (see the module docstring)."""

    def __init__(self, app: App, services: Services, index: int) -> None:
        self.app = app
        self.services = services
        self.name = name = f"{services.client_id}-m{index}"
        s = app.settings
        job = services.jobs.job
        self.awaiting_records = False
        """In ``getmany``, outside any batch: cancelling the loop here loses nothing.  During
        a rebalance ``getmany`` waits for the new assignment, however long that takes."""
        self._since_checkpoint = 0
        self._next_gate_poll = 0.0
        self._next_wall_tick = 0.0
        info = MemberInfo(
            p0=job.p0,
            p=job.p,
            layouts={},
            standby_replicas=s.standby_replicas,
            acceptable_lag=s.acceptable_recovery_lag,
        )
        assignor = StreamkitAssignor(info, self._standby_info if services.standbys is not None else None)
        self.consumer = consumer = GroupConsumer(
            services.connection, s, group_id=app.group_id, client_id=name, assignor=assignor
        )
        admission = Admission(
            consumer.control(GATE), group=app.group_id, name=name, seal=services.registry.origin_seal,
            sweep_ends=services.progress.sweep_ends,
        )  # fmt: skip
        router = Router(
            name, app.handlers, services.io, services.progress, services.registry, admission, s.max_ic_ranges,
            services.plain_partitions,
        )  # fmt: skip
        dispatcher = Dispatcher(
            name, app.tables, services.output, failure_alarm_after=s.failure_alarm_after,
            close_callbacks=app.window_close_callbacks, late_callbacks=app.late_callbacks,
        )  # fmt: skip
        catchup = CatchUp(
            name, services.io, services.registry, services.progress, app.handlers, app.input_topics,
            dispatcher, app.group_id, s.commit_every, self._send_output,
        )  # fmt: skip
        held_back = HeldBack(consumer.control(HELD))
        lagging = consumer_lagging(consumer, lambda: admission, held_back)
        self.parts = MemberParts(
            name, consumer, assignor, admission, router, dispatcher, held_back=held_back, lagging=lagging,
            catchup=catchup,
        )  # fmt: skip
        self.admission, self.dispatcher = admission, dispatcher
        self.tasks = TaskManager(app, services, self.parts)
        info.layouts = self.tasks.shapes()
        self.joining = Joining(app, services, self.parts, self.tasks)

    # -- what the worker reads -------------------------------------------------------------
    @property
    def processors(self) -> dict[int, ProcessorState]:
        return self.tasks.processors

    @property
    def job_p(self) -> int:
        return self.tasks.job_p

    def serving(self) -> list[ProcessorState]:
        return self.tasks.serving()

    def hosted(self) -> dict[int, list[tuple[str, int]]]:
        return self.tasks.hosted()

    def _standby_info(self, info: MemberInfo) -> None:
        self.tasks.standby_info(info)

    async def start(self) -> None:
        await self.consumer.start(self.app.input_topics, _Listener(self))
        self.services.adoptions.register(self.name, self.app.input_topics)

    def on_job_change(self, job: JobLayout) -> None:
        """The job changed: a new active count moves partitions (a rebalance, unless one step
        of a scale change: its bootstrap's host hands them over in place, ``scale.joining``);
        the next step of a scale change starts its bootstrap beside the processor it comes
        from, with no rebalance."""
        info = self.parts.assignor.info
        if abs(job.p - info.p) == 1 and self.tasks.assigned_generation >= 0:
            # one growth or shrink step: only the partitions of the splitting (or retiring and
            # receiving) processors move, and the host of the bootstrap hands them over in
            # place (or asks for a rebalance itself if it cannot)
            info.p = job.p
        elif job.p != info.p:
            info.p = job.p
            log.info("%s: job epoch %d has %d processors: rebalancing", self.name, job.epoch, job.p)
            self.consumer.request_rejoin()
            return
        self.joining.on_job_change(job)

    def on_layout_change(self, new: TopicLayout, old: TopicLayout | None) -> None:
        """A layout of an input topic changed: re-gate; rejoin if placement changed."""
        if new.topic not in self.app.handlers:
            return
        shape = shape_of(new)
        self.parts.assignor.info.layouts[new.topic] = shape
        self.tasks.regate_due = self.tasks.left_history_due = True
        before = shape_of(old) if old is not None else None
        if before is None or (before.active, before.draining, before.swept) != (
            shape.active, shape.draining, shape.swept
        ):  # fmt: skip
            log.info("%s: layout of %s is now epoch %d (active %d, draining %s): rebalancing",
                     self.name, new.topic, new.epoch, shape.active, list(shape.draining))  # fmt: skip
            self.consumer.request_rejoin()

    async def _send_output(self) -> None:
        await self.dispatcher.send_output()
        await self.services.output.flush()

    # -- the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        consumer = self.consumer
        settings = self.app.settings
        lock = self.services.lock
        wall_closes = settings.close_on == "wall"
        while not self.tasks.stopping:
            self.awaiting_records = True
            try:
                queued = [r for _, r in self.admission if r.scheduler is not None and r.scheduler.queued]
                batch = await consumer.getmany(
                    timeout_ms=0 if queued else 100 if self.admission.gated or self.tasks.held() else 200,
                    max_records=settings.max_batch_records,
                )
            finally:
                self.awaiting_records = False
            if self.tasks.fatal is not None:
                raise self.tasks.fatal
            if batch or queued or self.tasks.held():
                async with lock:
                    await self._handle(batch)
            elif merging := self.tasks.merging():  # a quiet input: its merge waits for no record
                async with lock:
                    for task in merging:
                        await task.go_live_if_caught_up()
            now = time.monotonic()
            if self.tasks.regate_due or (self.admission.gated and now >= self._next_gate_poll):
                self._next_gate_poll = now + GATE_POLL_SECONDS
                async with lock:
                    if self.admission.gated:
                        await self.services.progress.refresh()
                    await self.tasks.regate()
            if wall_closes and now >= self._next_wall_tick and self.tasks.active:
                self._next_wall_tick = now + WALL_TICK_SECONDS
                async with lock:
                    wall_ms = int((time.time() - settings.close_allowance) * 1000)
                    closed = [await task.tick_wall(wall_ms) for task in self.tasks.active.values() if task.serving()]
                    if any(closed):
                        await self.dispatcher.send_output()
            if self.tasks.active and (
                self._since_checkpoint >= settings.commit_every
                or now >= self.tasks.next_checkpoint
                or self.tasks.dirty_keys() >= settings.checkpoint_dirty_keys
                or self.tasks.sink_rows_due(settings.sink_rows_per_checkpoint)
            ):
                async with lock:
                    await self.tasks.checkpoint()
                collector.settle()
                self.services.beat()
                self._since_checkpoint = 0
                self.tasks.next_checkpoint = time.monotonic() + settings.commit_interval

    async def _handle(self, batch: dict[TopicPartition, list[Any]]) -> None:
        """One fetch answer: each partition batch admitted per route and applied by its
        task, then each task's end of batch (``Task.after_batch``), the back-pressure its
        merge calls for, the output."""
        consumed, held = await apply_fetched(self.admission, self.tasks.active, batch)
        self._since_checkpoint += consumed
        if held or self.parts.held_back.paused:
            self.parts.held_back.update(held)
        await self.dispatcher.send_output()
        if await catch_up_epochs(self.admission, self.services.registry):
            await self.tasks.regate()

    def request_stop(self) -> None:
        """Leave the loop after the current batch."""
        self.tasks.stopping = True

    async def stop(self, checkpoint: bool = True) -> None:
        """Checkpoint (unless told not to: after a failure mid-batch), close stores, leave."""
        async with self.services.lock:
            self.tasks.stopping = True
            if self.tasks.active and checkpoint:
                await self.dispatcher.fire(self.app.keys_revoked_callbacks, by_processor(self.admission))
                await self.tasks.checkpoint()
            self.tasks.close_all(discard=not checkpoint)
        self.services.adoptions.unregister(self.name)
        await self.consumer.stop()
