"""The lifecycle of a member's hosted processors: take an assignment, give it up, close,
checkpoint, gate again. The member's loop (``member``) decides when; this module does it.

Taking an assignment is a sequence of named steps (:meth:`TaskManager.take_assignment`):
fence the partitions, then per processor claim it in the sinks and open its store
(restored from the changelog first when the disk lost it or holds it behind a later
owner's checkpoint: ``taken_store``), catch it up with what the group handled, adopt the stream
time its windows closed at, read the history it left, and route its partitions; then
seek, record the routes, fire the key callbacks and gate.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from assignors.group import JobPlacement, MemberInfo, TopicShape
from assignors.group import ProcessorAssignment as Assignment
from streamkit.app import App
from streamkit.checkpoint_keys import PROCESSOR_COUNT
from streamkit.errors import HistoryTruncatedError
from streamkit.joins.merge import TimeMerge
from streamkit.ops.metrics import Durations
from streamkit.runtime import checkpointing
from streamkit.runtime.catchup import Stamp, shape_of
from streamkit.runtime.dispatch import by_processor
from streamkit.runtime.jobmeta import JobLayout
from streamkit.runtime.key_sets import StoreOpening, delete_retired_stores
from streamkit.runtime.parts import MemberParts
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.processor_sinks import ProcessorSinks
from streamkit.runtime.progress import Commit
from streamkit.runtime.rebuild import rebuild_unfinished
from streamkit.runtime.routing import Starts
from streamkit.runtime.services import Services
from streamkit.runtime.status import Restores
from streamkit.runtime.taken_store import open_taken
from streamkit.runtime.task import Task
from streamkit.sinks.base import Owner
from streamkit.state.changelog import position_of
from streamkit.state.restore import ChangelogSource

log = logging.getLogger(__name__)

__all__ = ["TaskManager"]

Slots = list[tuple[str, int, Any]]
"""An assignment's (topic, partition, key filter or None) of one processor."""


class TaskManager:
    """The processors a member hosts and their lifecycle (see the module docstring)."""

    def __init__(self, app: App, services: Services, parts: MemberParts) -> None:
        self.app = app
        self.services = services
        self.parts = parts
        self.name = parts.name
        self.active: dict[int, Task] = {}
        """The hosted processors' tasks, by processor id."""
        self.layout_epochs: dict[str, int] = {}
        self.assigned_generation = -1
        """The generation whose assignment this member processes: what its checkpoints are
        stamped with (the coordinator's own value is reset to -1 when it loses the group)."""
        self.job_p = services.jobs.job.p
        """The job's active processor count in the assignment this member processes."""
        self.handled_before: dict[int, dict[tuple[str, int], int]] = {}
        """Per processor that took keys over in place: where their old owner had handled
        them to (its positions at the handover), for a left-history read done later."""
        self.kafka_offsets: dict[TopicPartition, int] = {}
        """The Kafka offset this member committed last per partition."""
        self.fatal: Exception | None = None
        """What a rebalance step could not recover from; the member's loop raises it."""
        self.stopping = False
        self.next_checkpoint = 0.0
        """``time.monotonic()`` by which the loop checkpoints next (0: at its next turn, e.g.
        keys were revoked and other members wait for the commit)."""
        self.regate_due = False
        self.left_history_due = False
        self.restores = Restores(services.beat)
        self.rebalances = 0
        """Assignments taken (what the metrics count as rebalances)."""
        self.checkpoint_seconds = Durations()
        self.zombie_rejections = 0
        self.sinks = ProcessorSinks(app.name, app.sinks, services.output) if app.sinks else None
        self.on_close: list[Callable[[], None]] = []
        """Called when every processor is closed (a joining one's bootstrap with them)."""
        self.long_waits_closed = 0
        """``TimeMerge.long_waits`` of the tasks closed (the metric is a counter)."""

    # -- tasks -------------------------------------------------------------------------------
    def host(self, proc: ProcessorState) -> Task:
        """Host ``proc``: its task, reading nothing yet (``routing.Router`` routes it)."""
        merge = TimeMerge(self.app.settings.max_task_idle_ms)
        task = self.active[proc.id] = Task(proc, self.parts.dispatcher, merge, self.parts.lagging)
        if (writers := self.services.output.writers) is not None:  # processing="exactly_once"
            proc.attempts = writers.open(proc.id, self.assigned_generation, proc.loaded.extra, self.job_p)
        if self.sinks is not None:
            self.sinks.host(proc, Owner(self.services.jobs.job.incarnation, self.assigned_generation))
        return task

    def _unhost(self, task: Task) -> None:
        self.long_waits_closed += task.merge.long_waits
        if (writers := self.services.output.writers) is not None and task.proc.attempts is not None:
            writers.close(task.id, task.proc.attempts)
            task.proc.attempts = None
        if self.sinks is not None:
            self.sinks.unhost(task.proc)

    def let_go(self, task: Task) -> None:
        """Stop hosting ``task`` (its store stays open: the caller's): its routes go out of
        admission, its positions back to its checkpoint."""
        self.parts.admission.remove(task.let_go())
        self._unhost(task)
        del self.active[task.id]

    # -- views -------------------------------------------------------------------------------
    @property
    def processors(self) -> dict[int, ProcessorState]:
        """The hosted processors' states, by id (read-only: :meth:`host` adds one)."""
        return {pid: task.proc for pid, task in self.active.items()}

    def serving(self) -> list[ProcessorState]:
        """The hosted processors that have caught up with the group on every partition
        (a processor still rebuilding its state runs no timer: its state is incomplete)."""
        return [task.proc for task in self.active.values() if task.serving()]

    def hosted(self) -> dict[int, list[tuple[str, int]]]:
        """The (topic, partition)s each hosted processor consumes."""
        return {
            pid: [(tp.topic, tp.partition) for tp in task.routes] for pid, task in self.active.items() if task.routes
        }

    def held(self) -> int:
        """Records the tasks' time-ordered merges hold."""
        return sum(task.merge.held for task in self.active.values())

    def merging(self) -> list[Task]:
        """The tasks of a shrink's merged processors still on two stream times (``sides``)."""
        return [task for task in self.active.values() if task.proc.sides is not None]

    def long_waits(self) -> int:
        return self.long_waits_closed + sum(task.merge.long_waits for task in self.active.values())

    def shapes(self) -> dict[str, TopicShape]:
        """The input topics with a layout, as the registry knows them (no broker call): what
        this member tells the leader. ``CatchUp.shapes`` adds plain topics, asking the broker."""
        registry = self.services.registry
        return {t: shape_of(layout) for t in self.app.input_topics if (layout := registry.get(t)) is not None}

    def stamp(self, generation: int) -> Stamp:
        """What the checkpoints of a catch-up in ``generation`` are stamped with."""
        return lambda: (self.layout_epochs, generation)

    def opening(self, incarnation: str) -> StoreOpening:
        """How this worker opens a processor's store for the job's ``incarnation``."""
        s = self.app.settings
        return StoreOpening(self.app.tables, s.store_open_timeout, incarnation, self.app.name, self.services.memory)

    def dirty_keys(self) -> int:
        """The keys the hosted processors changed since the last checkpoint: what the next
        one writes (it commits every processor at once), so its pause."""
        return sum(c.dirty_count for t in self.active.values() for c in t.proc.caches.values())

    def sink_rows_due(self, rows: int) -> bool:
        """Whether the hosted processors' sink rows call for a checkpoint."""
        return self.sinks is not None and self.sinks.due((t.proc for t in self.active.values()), rows)

    def standby_info(self, info: MemberInfo) -> None:
        """What the leader places standbys by: this worker's disk and the stores it holds."""
        keeper = self.services.standbys
        assert keeper is not None
        info.disk = keeper.disk
        info.copies = keeper.positions(hosted=self.processors)
        for pid, proc in self.processors.items():  # its actives: the furthest copies there are
            if (at := position_of(proc.loaded)) is not None:
                info.copies[pid] = at

    # -- giving up ---------------------------------------------------------------------------
    async def release_all(self) -> None:
        """Partitions are being taken away: flush callbacks, checkpoint, commit, close stores."""
        async with self.services.lock:
            if not self.active:
                return
            log.info(
                "%s: giving up processors %s (generation %d)",
                self.name, sorted(self.active), self.parts.consumer.generation,
            )  # fmt: skip
            await self.parts.dispatcher.fire(self.app.keys_revoked_callbacks, by_processor(self.parts.admission))
            await self.checkpoint()
            if self.services.standbys is not None:  # what this disk holds, for the next assignment
                for pid, task in self.active.items():
                    self.services.standbys.note(pid, position_of(task.proc.loaded))
            self.close_all()

    def close_all(self, discard: bool = False) -> None:
        for closing in self.on_close:  # a joining processor's bootstrap waits for the lock we hold
            closing()
        for task in self.active.values():
            self._unhost(task)
            task.close(discard=discard)
        parts = self.parts
        parts.dispatcher.binder.unbind()
        self.active.clear()
        parts.admission.clear()
        parts.held_back.clear()
        parts.consumer.forget_pauses()
        self.kafka_offsets.clear()  # each sharer commits its view once again in the next generation
        self.assigned_generation = -1

    # -- taking ------------------------------------------------------------------------------
    async def take_assignment(self, after: Callable[[int], Any] | None = None) -> None:
        """Take the assignment the group gave (see the module docstring); ``after(generation)``
        runs last, with the lock held (a scale change's next step starts there)."""
        async with self.services.lock:
            assignment = self.parts.assignor.assignment
            if assignment is None or self.stopping:
                return
            generation = self.parts.consumer.generation
            log.info("%s: assigned processors %s (generation %d)", self.name, sorted(assignment.processors), generation)
            await self._fence(assignment, generation)
            starts = Starts()
            for pid in sorted(assignment.processors):
                slots = assignment.processors[pid]
                taken = await self._take(pid, slots, assignment, assignment.p0, assignment.p, generation)
                if taken is None:
                    return  # (the history is gone: ``fatal`` stops the worker)
                starts.update(taken)
            await self._route(starts, generation)
            await self._standbys(assignment)
            if after is not None:
                await after(generation)
            self.delete_retired()
            self.services.beat()
            log.info("%s: hosts processors %s (generation %d): %s", self.name, sorted(self.active), generation,
                     sorted(self.parts.admission.routes))  # fmt: skip
            outdated = assignment.outdated(self.services.jobs.job.p, self.shapes())
            if outdated is not None:
                log.info("%s: %s: rebalancing again", self.name, outdated)
                self.parts.consumer.request_rejoin()

    async def take_in_place(self, pid: int, placed: JobPlacement, p0: int, p: int, generation: int) -> Starts | None:
        """Host processor ``pid`` where ``placed`` (``p`` processors) puts it, without a rebalance (a shrink
        whose two processors are both hosted here): steps 2 and 3 of an assignment for it,
        and its routes; the caller seeks and records them. None: its history is gone
        (``fatal``)."""
        return await self._take(pid, placed.slots.get(pid, []), placed, p0, p, generation)

    async def _take(
        self, pid: int, slots: Slots, placed: JobPlacement | Assignment, p0: int, p: int, generation: int
    ) -> Starts | None:
        """Steps 2 and 3 for processor ``pid`` reading ``slots``, and its routes (where each
        starts)."""
        task = await self._open(pid, p0, p, generation)
        if not await self._catch_up(task.proc, slots, p0, p, generation):
            return None
        starts = Starts()
        starts.update(self.parts.router.slots(task, slots, placed.sharers, p0, p))
        starts.update(self.parts.router.sweeps(task, placed.sweeps.get(pid, [])))
        await task.go_live_if_caught_up()
        return starts

    async def _fence(self, assignment: Assignment, generation: int) -> None:
        """Step 1: from now on, commits of these partitions from older generations are refused;
        the layouts are at least at the epochs the assignment was made with."""
        progress, registry = self.services.progress, self.services.registry
        self.assigned_generation = generation
        self.rebalances += 1
        self.handled_before.clear()  # a processor's own position says what it handled now
        whole = {(t, q): None for pid, slots in assignment.processors.items() for t, q, f in slots if f is None}
        shared = {
            (t, q, pid): (None, assignment.sharers[(t, q)])
            for pid, slots in assignment.processors.items()
            for t, q, f in slots
            if f is not None
        }
        await progress.record(self.name, generation, assignment.epochs, Commit(whole, shared))
        await progress.refresh()
        for topic, epoch in assignment.epochs.items():
            await registry.ensure_at_least(topic, epoch)
        self.layout_epochs = {t: lay.epoch for t in self.app.input_topics if (lay := registry.get(t))}
        self.job_p = assignment.p

    async def _open(self, pid: int, p0: int, p: int, generation: int) -> Task:
        """Step 2: the processor's store, restored from the changelog first when this disk
        has none or a later owner's checkpoint is beyond it (``taken_store``), and put on
        the changelog's chain (a zombie's later markers lose)."""
        settings, services = self.app.settings, self.services
        path = self.app.store_path(pid, settings.state_dir)
        incarnation = services.jobs.job.incarnation
        if self.sinks is not None:  # before the state is read (``processor_sinks``)
            await self.sinks.claim(pid, Owner(incarnation, generation))
        if services.standbys is not None:  # a standby here, or a store left here: caught up
            await services.standbys.release(pid)
        changelog = services.changelog
        topic = changelog.topic if changelog is not None else ""
        source = ChangelogSource(services.io, topic, self.app.tables, p0, incarnation)
        proc = await open_taken(
            pid, path, changelog, source, self.opening(incarnation), p, log_as=self.name, restores=self.restores
        )
        task = self.host(proc)
        if changelog is not None and position_of(proc.loaded) is not None:
            after = await changelog.takeover(pid, proc.loaded.replace(generation=generation))
            proc.loaded = after.replace(generation=proc.loaded.generation)  # (unlogged: a snapshot next)
            proc.store.commit({}, proc.loaded)  # the store is on the chain through the takeover
        for topic, epoch in proc.loaded.layout_epochs.items():
            if topic in self.app.handlers:  # the store saw a newer layout than we know
                await services.registry.ensure_at_least(topic, epoch)
        return task

    async def _catch_up(self, proc: ProcessorState, slots: Slots, p0: int, p: int, generation: int) -> bool:
        """Step 3: what the group handled beyond the store, the stream time its windows had
        closed at, the history of partitions it no longer reads. False: the history to
        catch up from is gone (``fatal``)."""
        progress, catchup, stamp = self.services.progress, self.parts.catchup, self.stamp(generation)
        at = proc.positions
        behind = [(t, q) for t, q, f in slots if progress.position(t, q, proc.id if f else None) > at.get((t, q), 0)]
        if behind or rebuild_unfinished(proc.loaded):
            try:
                await catchup.rebuild(proc, stamp, p0, p)
            except HistoryTruncatedError as exc:  # the member's loop raises it: the worker stops
                self.fatal = exc
                return False
        if proc.window_states:  # a partition's last owner closed what its stream time closed: sent
            taken = [progress.stream_time(t, q) for t, q, shared in slots if not shared]
            await self.active[proc.id].adopt_stream_time(max(taken, default=-1))
        await catchup.read_left_history(proc, stamp, p0, p, [(t, q) for t, q, _ in slots])
        return True

    async def _route(self, starts: Starts, generation: int) -> None:
        """Step 4: seek every routed partition, record where each starts, fire the key
        callbacks, gate."""
        admission, consumer = self.parts.admission, self.parts.consumer
        for tp in admission.routes:
            consumer.seek(tp, admission.fetch_position(tp))
        await self.mark_attempts()
        await self.parts.router.record(self.name, generation, self.layout_epochs, starts)
        self.next_checkpoint = time.monotonic() + self.app.settings.commit_interval
        await self.parts.dispatcher.fire(self.app.keys_assigned_callbacks, by_processor(admission))
        await self.regate()

    async def _standbys(self, assignment: Assignment) -> None:
        if self.services.standbys is not None:
            await self.services.standbys.assign(
                self.name, assignment.standbys, self.processors, assignment.p0, assignment.warmups,
                self.parts.consumer.request_rejoin,
            )  # fmt: skip

    def delete_retired(self, job: JobLayout | None = None) -> None:
        """Delete the stores of the processors ``job`` (default: the job as last read)
        retired that nobody holds."""
        job = job or self.services.jobs.job
        retired = delete_retired_stores(self.app.store_path(0, self.app.settings.state_dir).parent, job.hosted)
        if retired:
            log.info("%s: deleted the stores of retired processors %s", self.name, retired)

    # -- gates -------------------------------------------------------------------------------
    async def regate(self) -> None:
        """Recompute the gates; fire the key callbacks they call for."""
        self.regate_due = False
        admission, dispatcher = self.parts.admission, self.parts.dispatcher
        if self.left_history_due:  # a seal that landed after the assignment: our keys below it first
            self.left_history_due = not await self._read_left_history()
        events = admission.regate(self.services.registry.get, self.services.progress.positions)
        for topic in self.app.handlers:
            if (layout := self.services.registry.get(topic)) is not None:
                self.services.adoptions.adopted(self.name, topic, layout.epoch)
        if events.revoked:  # flush the keys' state, then commit at once: other members wait for it
            await dispatcher.fire(self.app.keys_revoked_callbacks, by_processor(admission, events.revoked))
            self.next_checkpoint = 0.0
        if events.assigned:
            await dispatcher.fire(self.app.keys_assigned_callbacks, by_processor(admission, events.assigned))

    async def _read_left_history(self) -> bool:
        """Each hosted processor reads what it lacks of partitions it no longer consumes
        (``CatchUp.read_left_history``), now that a layout changed. False: not now (between
        generations; the next regate tries again)."""
        assignment = self.parts.assignor.assignment
        if assignment is None or self.assigned_generation != self.parts.consumer.generation:
            return False
        stamp = self.stamp(self.assigned_generation)
        for task in self.active.values():
            owned = [(tp.topic, tp.partition) for tp, r in task.routes.items() if not r.swept]
            handled = self.handled_before.get(task.id)
            await self.parts.catchup.read_left_history(task.proc, stamp, assignment.p0, self.job_p, owned, handled)
        await self.mark_attempts()  # (its output is beyond every group position: no receiver would send it again)
        return True

    # -- checkpoints -------------------------------------------------------------------------
    async def checkpoint(self) -> None:
        """Checkpoint every hosted processor (``checkpointing.checkpoint``); a zombie's is
        refused: its uncommitted state is dropped and the member rejoins."""
        started = time.perf_counter()
        slots = [
            checkpointing.Slot(tp, r.proc, r.committed, r.sharers, r.swept, max(r.forwarded, default=-1) + 1,
                               self.kafka_offsets.get(tp, -1))
            for task in self.active.values() for tp, r in task.routes.items()
        ]  # fmt: skip
        try:
            stamp = checkpointing.CheckpointStamp(
                self.name, self.assigned_generation, self.layout_epochs, {PROCESSOR_COUNT: self.job_p}
            )
            output = self.services.output
            sinks = checkpointing.CheckpointSinks(
                self.services.progress, output.flush, self._commit_offsets, self.services.changelog,
                commit_attempts=self.mark_attempts if output.writers is not None else None,
                commit_rows=self._commit_rows if self.sinks is not None else None,
            )  # fmt: skip
            committed = await checkpointing.checkpoint(stamp, self.active.values(), slots, sinks)
        except checkpointing.ZombieCheckpointError as exc:
            self.zombie_rejections += 1
            log.error("%s: %s; dropping uncommitted state and rejoining", self.name, exc)
            self.close_all(discard=True)
            self.parts.consumer.request_rejoin()
            return
        for task in self.active.values():
            for tp, route in task.routes.items():
                route.committed = committed.get((tp, task.id), route.committed)
        self.checkpoint_seconds.observe(time.perf_counter() - started)

    async def mark_attempts(self, tasks: Iterable[Task] | None = None) -> None:
        """Exactly-once: the markers of what the stores hold committed go out, each new
        incarnation announced first (``exactly_once.writer``); at checkpoints, and before route
        starts are recorded, so no group position lies beyond an attempt without markers."""
        tasks = self.active.values() if tasks is None else tasks
        writers = [task.proc.attempts for task in tasks if task.proc.attempts is not None]
        if writers:
            output = self.services.output
            mark = output.producer.mark  # type: ignore[attr-defined]
            declared = output.declared()  # every topic it may have sent to, its own inputs too
            await asyncio.gather(*(writer.committed(mark, declared) for writer in writers))

    async def _commit_rows(self, tasks: Iterable[Task]) -> None:
        assert self.sinks is not None
        await self.sinks.commit_rows(task.proc for task in tasks)

    async def _commit_offsets(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        await self.parts.consumer.commit(offsets)
        self.kafka_offsets.update((tp, o.offset) for tp, o in offsets.items())
