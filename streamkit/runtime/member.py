"""A group member: one consumer that hosts zero or more processors.

The member keeps the consumer loop and the rebalances. Turning an assignment's slots
into routes is routing's (`routing.Router`), what may be applied of a fetch answer is
admission's (`admission.Admission`), applying it is dispatch's (`dispatch.Dispatcher`),
and the commit sequence is `checkpointing.checkpoint`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from assignors.group import MemberInfo, StreamkitAssignor, TopicShape, place_job
from streamkit.app import App
from streamkit.errors import AssignmentError, HistoryTruncatedError
from streamkit.joins.merge import TimeMerge
from streamkit.kafkaio import fetch as lean_fetch
from streamkit.layout.model import TopicLayout
from streamkit.ops.metrics import Durations
from streamkit.runtime import checkpointing, collector
from streamkit.runtime.admission import Admission
from streamkit.runtime.catchup import CatchUp, Stamp, shape_of
from streamkit.runtime.dispatch import Dispatcher, by_processor
from streamkit.runtime.epochs import catch_up_epochs
from streamkit.runtime.jobmeta import Bootstrap, JobLayout
from streamkit.runtime.merging import HeldBack, apply_merged, consumer_lagging, merged_inputs, release_merged
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.rebuild import rebuild_unfinished
from streamkit.runtime.routes import rebuilt_all
from streamkit.runtime.routing import Router, Starts
from streamkit.runtime.scaling import (
    adopt_windows,
    bootstrap_step,
    delete_retired_stores,
    open_for_count,
    purge_moved_keys,
    seed_from_changelog,
    staging_path,
)
from streamkit.runtime.services import Services
from streamkit.runtime.staging_seed import StagingSeed
from streamkit.runtime.status import Restores
from streamkit.state.changelog import position_of
from streamkit.state.restore import restore_store

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
            await self.member.release_all()
        except Exception as exc:
            self._fail("giving up its partitions", exc)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        try:
            await self.member.take_assignment()
        except Exception as exc:
            self._fail("taking its partitions", exc)

    def _fail(self, doing: str, exc: Exception) -> None:
        log.exception("%s: %s failed", self.member.name, doing)
        if self.member.fatal is None:
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.member.fatal = AssignmentError(f"{self.member.name}: {doing} failed, so it stops: {why}")


class GroupMember:
    def __init__(self, app: App, services: Services, index: int) -> None:
        self.app = app
        self.services = services
        self.name = f"{services.client_id}-m{index}"
        self.processors: dict[int, ProcessorState] = {}
        self.layout_epochs: dict[str, int] = {}
        self.assigned_generation = -1
        """The generation whose assignment this member processes: what its checkpoints are
        stamped with (the coordinator's own value is reset to -1 when it loses the group)."""
        self.zombie_rejections = 0
        self._kafka_offsets: dict[TopicPartition, int] = {}
        """The Kafka offset this member committed last per partition."""
        self.fatal: Exception | None = None
        """What a rebalance callback could not recover from; the loop raises it."""
        self.awaiting_records = False
        """In ``getmany``, outside any batch: cancelling the loop here loses nothing.  During
        a rebalance ``getmany`` waits for the new assignment, however long that takes."""
        self._since_checkpoint = 0
        self._next_checkpoint = 0.0
        self._next_gate_poll = 0.0
        self._next_wall_tick = 0.0
        self._regate_needed = False
        self._left_history_due = False
        self._handled_before: dict[int, dict[tuple[str, int], int]] = {}
        """Per processor that took keys over in place: where their old owner had handled
        them to (its positions at the handover), for a left-history read done later."""
        self._stopping = False
        self._bootstrap_failures = 0
        """Bootstraps started here that failed (each rejoin to retry waits longer)."""
        self._tasks: set[asyncio.Task[None]] = set()
        s = app.settings
        job = services.jobs.job
        info = MemberInfo(
            p0=job.p0, p=job.p, layouts=self._shapes(), standby_replicas=s.standby_replicas,
            acceptable_lag=s.acceptable_recovery_lag,
        )  # fmt: skip
        self.assignor = StreamkitAssignor(info, self._standby_info if services.standbys is not None else None)
        self.job_p = job.p
        """The job's active processor count in the assignment this member processes."""
        self._joining: dict[int, tuple[ProcessorState, asyncio.Task[None]]] = {}
        """A processor joining the job, hosted beside the one that splits (no rebalance)."""
        self.joining: dict[int, dict[str, int]] = {}
        """Bootstrap progress of the joining processors hosted here (status)."""
        self.restores = Restores(services.beat)
        self.rebalances = 0
        """Assignments taken (what the metrics count as rebalances)."""
        self.checkpoint_seconds = Durations()
        lean_fetch.install()
        self.consumer = AIOKafkaConsumer(
            **services.connection.client_kwargs(),
            group_id=app.group_id,
            client_id=self.name,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            partition_assignment_strategy=(self.assignor,),
            session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            max_poll_interval_ms=s.max_poll_interval_ms,
            fetch_max_bytes=s.fetch_max_bytes,
            fetch_max_wait_ms=s.fetch_max_wait_ms,
            max_partition_fetch_bytes=s.max_partition_fetch_bytes,
        )
        self.admission = Admission(
            self.consumer, group=app.group_id, name=self.name, seal=services.registry.origin_seal,
            sweep_ends=services.progress.sweep_ends,
        )  # fmt: skip
        self.router = Router(
            self.name, app.handlers, services.io, services.progress, services.registry, self.admission, s.max_ic_ranges,
            services.plain_partitions,
        )  # fmt: skip
        self.dispatcher = Dispatcher(
            self.name, app.tables, services.output, failure_alarm_after=s.failure_alarm_after,
            close_callbacks=app.window_close_callbacks, late_callbacks=app.late_callbacks,
        )  # fmt: skip
        self.merge = TimeMerge(s.max_task_idle_ms)
        """The time-ordered merge of each hosted processor's input topics."""
        self.held_back = HeldBack(self.consumer)
        self._lagging = consumer_lagging(self.consumer, lambda: self.admission, self.held_back)
        self.catchup = CatchUp(
            self.name, services.io, services.registry, services.progress, app.handlers, app.input_topics,
            self.dispatcher, app.group_id, s.commit_every, self._send_output,
        )  # fmt: skip

    # -- what the worker reads -------------------------------------------------------------
    def serving(self) -> list[ProcessorState]:
        """The hosted processors that have caught up with the group on every partition
        (a processor still rebuilding its state runs no timer: its state is incomplete)."""
        behind = {id(r.proc) for _, r in self.admission if r.position < r.rebuild_until}
        return [proc for proc in self.processors.values() if id(proc) not in behind]

    def hosted(self) -> dict[int, list[tuple[str, int]]]:
        """The (topic, partition)s each hosted processor consumes."""
        out: dict[int, list[tuple[str, int]]] = {}
        for tp, route in self.admission:
            out.setdefault(route.proc.id, []).append((tp.topic, tp.partition))
        return out

    @property
    def generation(self) -> int:
        coordinator = self.consumer._coordinator
        return coordinator.generation if coordinator is not None else -1

    def _shapes(self) -> dict[str, TopicShape]:
        """The input topics with a layout, as the registry knows them (no broker call): what
        this member tells the leader. ``CatchUp.shapes`` adds plain topics, asking the broker."""
        registry = self.services.registry
        return {t: shape_of(layout) for t in self.app.input_topics if (layout := registry.get(t)) is not None}

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.subscribe(self.app.input_topics, listener=_Listener(self))
        self.services.adoptions.register(self.name, self.app.input_topics)

    def on_job_change(self, job: JobLayout) -> None:
        """The job changed: a new active count moves partitions (a rebalance); the next step
        of a scale change starts its bootstrap beside the processor it comes from, with no
        rebalance."""
        info = self.assignor.info
        if job.p == info.p + 1 and self.assigned_generation >= 0:
            # one growth step: only the splitting processor's partitions move, and its host
            # hands them over in place (or asks for a rebalance itself if it cannot)
            info.p = job.p
        elif job.p != info.p:
            info.p = job.p
            log.info("%s: job epoch %d has %d processors: rebalancing", self.name, job.epoch, job.p)
            self.consumer._coordinator.request_rejoin()
            return
        if job.bootstrap is not None and self.assigned_generation >= 0:
            task = asyncio.create_task(
                self._host_joining_locked(job, self.assigned_generation),
                name=f"the store of joining processor {job.bootstrap.pid}",
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(self._bootstrap_ended)  # opening its store failed: the same

    async def _host_joining_locked(self, job: JobLayout, generation: int) -> None:
        async with self.services.lock:
            if generation == self.assigned_generation:  # no rebalance meanwhile
                await self._host_joining(job, generation)

    async def _host_joining(self, job: JobLayout, generation: int) -> None:
        """If this member hosts the processor that the scale change's next step comes from,
        open the store to bootstrap here and start the bootstrap (``scaling``): a joining
        processor's own store, or the receiving processor's staging store. Call with the
        lock held."""
        step = job.bootstrap
        if step is None or step.pid in self._joining or step.beside not in self.processors:
            return
        path = self.app.store_path(step.pid, self.app.settings.state_dir)
        proc = await open_for_count(
            step.pid, staging_path(path) if step.staging else path, self.app.tables, job.p0, step.count,
            timeout=self.app.settings.store_open_timeout, log_as=self.name, incarnation=job.incarnation,
            app=self.app.name, memory=self.services.memory,
        )  # fmt: skip
        if step.staging:  # two processors' keys, each on its own stream time until it goes live
            proc.hold_sides(job.p0, step.count + 1)
        self.assignor.info.hosted = sorted({*self.assignor.info.hosted, step.pid})  # keep it here at the handover
        task = asyncio.create_task(self._bootstrap(proc, step, generation), name=f"bootstrap of processor {step.pid}")
        task.add_done_callback(self._bootstrap_ended)
        self._joining[step.pid] = (proc, task)

    def _bootstrap_ended(self, task: asyncio.Task[None]) -> None:
        """A bootstrap that failed is said, and retried after a rebalance (which closes it):
        left alone, the scale change would wait for it for ever."""
        if task.cancelled() or task.exception() is None:
            return
        self._bootstrap_failures += 1
        delay = min(2.0**self._bootstrap_failures, 60.0)  # one that fails every time: not a rebalance storm
        log.error("%s: %s failed (%s: %s); rejoining the group in %.0f s to start it again", self.name,
                  task.get_name(), type(task.exception()).__name__, task.exception(), delay,
                  exc_info=task.exception())  # fmt: skip
        asyncio.get_running_loop().call_later(delay, self._rejoin_unless_stopping)

    def _rejoin_unless_stopping(self) -> None:
        if not self._stopping:
            self.consumer._coordinator.request_rejoin()

    def on_layout_change(self, new: TopicLayout, old: TopicLayout | None) -> None:
        """A layout of an input topic changed: re-gate; rejoin if placement changed."""
        if new.topic not in self.app.handlers:
            return
        shape = shape_of(new)
        self.assignor.info.layouts[new.topic] = shape
        self._regate_needed = self._left_history_due = True
        before = shape_of(old) if old is not None else None
        moved = before is None or (before.active, before.draining, before.swept) != (
            shape.active,
            shape.draining,
            shape.swept,
        )
        if moved:
            log.info(
                "%s: layout of %s is now epoch %d (active %d, draining %s): rebalancing",
                self.name,
                new.topic,
                new.epoch,
                shape.active,
                list(shape.draining),
            )
            self.consumer._coordinator.request_rejoin()

    # -- rebalances -----------------------------------------------------------------------
    async def release_all(self) -> None:
        """Partitions are being taken away: flush callbacks, checkpoint, commit, close stores."""
        async with self.services.lock:
            if not self.processors:
                return
            log.info("%s: giving up processors %s (generation %d)", self.name, sorted(self.processors), self.generation)
            await self.dispatcher.fire(self.app.keys_revoked_callbacks, by_processor(self.admission))
            await self._checkpoint()
            if self.services.standbys is not None:  # what this disk holds, for the next assignment
                for pid, proc in self.processors.items():
                    self.services.standbys.note(pid, position_of(proc.loaded))
            self._close_all()

    def _close_all(self, discard: bool = False) -> None:
        for joining, task in self._joining.values():  # the task waits for the lock we hold, or fetches
            task.cancel()
            joining.close()
        self._joining.clear()
        self.joining.clear()
        for proc in self.processors.values():
            if discard:
                proc.discard()
            proc.close()
        self.dispatcher.binder.unbind()
        self.processors.clear()
        self.admission.clear()
        self.merge.clear()
        self.held_back.clear()
        self._kafka_offsets.clear()  # each sharer commits its view once again in the next generation
        self.assigned_generation = -1

    async def take_assignment(self) -> None:
        """Fence the partitions, open our processors' stores, seek to their checkpoints."""
        async with self.services.lock:
            assignment = self.assignor.assignment
            if assignment is None or self._stopping:
                return
            log.info(
                "%s: assigned processors %s (generation %d)", self.name, sorted(assignment.processors), self.generation
            )
            progress, registry = self.services.progress, self.services.registry
            generation = self.assigned_generation = self.generation
            self.rebalances += 1
            self._handled_before.clear()  # a processor's own position says what it handled now
            whole = {(t, q): None for pid, slots in assignment.processors.items() for t, q, f in slots if f is None}
            shared = {
                (t, q, pid): (None, assignment.sharers[(t, q)])
                for pid, slots in assignment.processors.items()
                for t, q, f in slots
                if f is not None
            }
            # from now on, commits of these partitions from older generations are refused
            await progress.record(self.name, generation, assignment.epochs, whole, shared)
            await progress.refresh()
            for topic, epoch in assignment.epochs.items():
                await registry.ensure_at_least(topic, epoch)
            self.layout_epochs = {t: lay.epoch for t in self.app.input_topics if (lay := registry.get(t))}
            settings = self.app.settings
            self.job_p = assignment.p
            starts = Starts()
            stamp = self._stamp(generation)
            changelog = self.services.changelog
            for pid, slots in sorted(assignment.processors.items()):
                path = self.app.store_path(pid, settings.state_dir)
                if self.services.standbys is not None:  # a standby here, or a store left here: caught up
                    await self.services.standbys.release(pid)
                if changelog is not None and not path.exists():  # a lost disk, or a new machine
                    try:
                        await restore_store(self.services.io, changelog.topic, pid, path, self.app.tables,
                                            p0=assignment.p0, incarnation=self.services.jobs.job.incarnation,
                                            log_as=self.name, on_read=self.restores.tracker(pid))  # fmt: skip
                    finally:
                        self.restores.done(pid)
                proc = await open_for_count(
                    pid, path, self.app.tables, assignment.p0, assignment.p, adopt=True,
                    timeout=settings.store_open_timeout, log_as=self.name,
                    incarnation=self.services.jobs.job.incarnation, app=self.app.name,
                    memory=self.services.memory,
                )  # fmt: skip
                self.processors[pid] = proc
                if changelog is not None and position_of(proc.loaded) is not None:  # a zombie's markers lose
                    after = await changelog.takeover(pid, proc.loaded.replace(generation=generation))
                    proc.loaded = after.replace(generation=proc.loaded.generation)  # (unlogged: a snapshot next)
                    proc.store.commit({}, proc.loaded)  # the store is on the chain through the takeover
                for topic, epoch in proc.loaded.layout_epochs.items():
                    if topic in self.app.handlers:  # the store saw a newer layout than we know
                        await registry.ensure_at_least(topic, epoch)
                behind = [
                    (t, q) for t, q, f in slots
                    if progress.position(t, q, pid if f else None) > proc.positions.get((t, q), 0)
                ]  # fmt: skip
                if behind or rebuild_unfinished(proc.loaded):
                    try:
                        await self.catchup.rebuild(proc, stamp, assignment.p0, assignment.p)
                    except HistoryTruncatedError as exc:  # the member's loop raises it: the worker stops
                        self.fatal = exc
                        return
                if proc.window_states:  # a partition's last owner closed what its stream time closed: sent
                    taken = [progress.stream_time(t, q) for t, q, shared in slots if not shared]
                    await self.dispatcher.adopt_stream_time(proc, max(taken, default=-1))
                await self.catchup.read_left_history(
                    proc, stamp, assignment.p0, assignment.p, [(t, q) for t, q, _ in slots]
                )
                starts.update(self.router.slots(proc, slots, assignment.sharers, assignment.p0, assignment.p))
                starts.update(self.router.sweeps(proc, assignment.sweeps.get(pid, [])))
                await self._go_live_if_caught_up(proc)
            for tp in self.admission.routes:
                self.consumer.seek(tp, self.admission.fetch_position(tp))
            await self.router.record(self.name, generation, self.layout_epochs, starts)
            self._next_checkpoint = time.monotonic() + settings.commit_interval
            await self.dispatcher.fire(self.app.keys_assigned_callbacks, by_processor(self.admission))
            await self._regate()
            if self.services.standbys is not None:
                await self.services.standbys.assign(
                    self.name, assignment.standbys, self.processors, assignment.p0, assignment.warmups,
                    self.consumer._coordinator.request_rejoin,
                )  # fmt: skip
            job = self.services.jobs.job
            await self._host_joining(job, generation)
            retired = delete_retired_stores(self.app.store_path(0, settings.state_dir).parent, job.hosted)
            if retired:
                log.info("%s: deleted the stores of retired processors %s", self.name, retired)
            self.services.beat()
            log.info(
                "%s: hosts processors %s (generation %d): %s",
                self.name,
                sorted(self.processors),
                generation,
                sorted(self.admission.routes),
            )
            outdated = assignment.outdated(self.services.jobs.job.p, self._shapes())
            if outdated is not None:
                log.info("%s: %s: rebalancing again", self.name, outdated)
                self.consumer._coordinator.request_rejoin()

    async def _hand_over_in_place(self, joined: ProcessorState, split: int, job: JobLayout, generation: int) -> bool:
        """A growth step whose splitting processor is hosted here, beside the joined one:
        move the joined processor's partitions from the splitting one to it inside this
        member, with no group rebalance (the member keeps fetching the same partitions).
        The splitting processor checkpoints first (its positions are T1); the joined one
        replays from its bootstrap's positions to T1 without output and goes on with output.
        False if it cannot be done here (the member lost the processor, or a partition of
        theirs is shared with a processor elsewhere): the caller asks for a rebalance.
        Call with the lock held."""
        old = self.processors.get(split)
        if generation != self.assigned_generation or old is None:
            return False
        placed = place_job(await self.catchup.shapes(), job.p0, job.p)
        if not placed.shared_only_among((split, joined.id)):
            return False
        moving = [tp for tp, r in self.admission if r.proc is old]
        await self.dispatcher.fire(self.app.keys_revoked_callbacks, {old: moving})
        await self._checkpoint()  # its positions are T1; a zombie's is refused and it lets go of everything
        if generation != self.assigned_generation or self.processors.get(split) is not old:
            return False
        self.admission.remove([r for _, r in self.admission if r.proc is old])
        self.merge.drop(old.id)
        old.rewind()  # what its routes had not finished goes back to the checkpoint: refetched
        self._joining.pop(joined.id, None)
        self.joining.pop(joined.id, None)
        self.processors[joined.id] = joined
        self.job_p = self.assignor.info.p = job.p
        self.assignor.info.hosted = sorted(self.processors)
        if joined.window_states:  # from T1 on its keys' windows close as the old owner's did
            await self.catchup.rebuild(joined, self._stamp(generation), job.p0, job.p)
            adopt_windows(joined, old, self.app.tables, job.p0, job.p)
            await self.dispatcher.adopt_stream_time(joined, min(old.stream_time, old.fired_through))
        purged = purge_moved_keys(old, self.app.tables, job.p0, job.p)
        # below a seal, the joined processor's keys past where the old owner got are its own now
        handled = self._handled_before[joined.id] = dict(old.positions)
        owned = [(t, q) for t, q, _ in placed.slots.get(joined.id, [])]
        await self.catchup.read_left_history(joined, self._stamp(generation), job.p0, job.p, owned, handled)
        starts = Starts()
        for proc in (old, joined):
            starts.update(self.router.slots(proc, placed.slots.get(proc.id, []), placed.sharers, job.p0, job.p))
            starts.update(self.router.sweeps(proc, placed.sweeps.get(proc.id, [])))
        for tp in moving:
            self.consumer.seek(tp, self.admission.fetch_position(tp))
        await self.router.record(self.name, generation, self.layout_epochs, starts)
        await self.dispatcher.fire(
            self.app.keys_assigned_callbacks, by_processor((tp, r) for tp, r in self.admission if r.proc is joined)
        )
        await self._regate()
        log.info("%s: processor %d took over its partitions from processor %d in place (no rebalance); "
                 "processor %d: %d keys moved to it, deleted", self.name, joined.id, split, split, purged)  # fmt: skip
        return True

    def _stamp(self, generation: int) -> Stamp:
        """What the checkpoints of a catch-up in ``generation`` are stamped with."""
        return lambda: (self.layout_epochs, generation)

    async def _bootstrap(self, proc: ProcessorState, step: Bootstrap, generation: int) -> None:
        """Bootstrap ``proc`` for the scale change's next step beside the member's loop
        (``scaling``)."""

        def report(progress: dict[str, int]) -> None:
            self.joining[proc.id] = progress
            self.services.beat()  # status shows it now, not at the next heartbeat

        stepped = await bootstrap_step(
            proc, job=self.services.jobs.job, step=step, io=self.services.io, registry=self.services.registry,
            progress=self.services.progress, handlers=self.app.handlers, topics=self.catchup.topics,
            dispatcher=self.dispatcher, lock=self.services.lock, stamp=self._stamp(generation),
            group=self.app.group_id, checkpoint_every=self.app.settings.commit_every,
            checkpoint_interval=self.app.settings.commit_interval, max_rate=self.app.settings.bootstrap_rate,
            report=report, by=self.name, seed=self._changelog_seed(proc, step, generation),
        )  # fmt: skip
        if stepped is None:
            return
        async with self.services.lock:
            try:
                done = not step.staging and await self._hand_over_in_place(proc, step.beside, stepped, generation)
            except Exception:  # noqa: BLE001 - the rebalance below hands over from the stores
                log.exception("%s: the handover of processor %d in place failed", self.name, proc.id)
                self._close_all()
                done = False
            if not done:
                log.info("%s: job epoch %d has %d processors: rebalancing", self.name, stepped.epoch, stepped.p)
                self.assignor.info.p = stepped.p
                self.consumer._coordinator.request_rejoin()
            elif self.services.standbys is not None:  # the leader places the new processor's copies
                log.info("%s: processor %d joined: rebalancing to place its standbys", self.name, proc.id)
                self.consumer._coordinator.request_rejoin()

    def _changelog_seed(
        self, proc: ProcessorState, step: Bootstrap, generation: int
    ) -> Callable[[], Awaitable[bool]] | None:
        """A bootstrap's start from changelogs (None: the job has no changelog): a joining
        processor's from its source's, a shrink's staging store from those of the two
        processors it merges (``staging_seed``)."""
        changelog, job = self.services.changelog, self.services.jobs.job
        if changelog is None:
            return None
        source = self.processors.get(step.beside)
        if step.staging:
            seed = StagingSeed(self.catchup, changelog.topic, self.app.tables, job.p0, job.incarnation,
                               self.services.lock, self._stamp(generation), self.services.memory)  # fmt: skip
            return lambda: seed(proc, source, step.count)
        return lambda: seed_from_changelog(
            proc, source, io=self.services.io, topic=changelog.topic, count=step.count,
            p0=job.p0, tables=self.app.tables, incarnation=job.incarnation, log_as=self.name,
        )  # fmt: skip

    async def _send_output(self) -> None:
        await self.dispatcher.send_output()
        await self.services.output.flush()

    async def _regate(self) -> None:
        """Recompute the gates; fire the key callbacks they call for."""
        self._regate_needed = False
        if self._left_history_due:  # a seal that landed after the assignment: our keys below it first
            self._left_history_due = not await self._read_left_history()
        events = self.admission.regate(self.services.registry.get, self.services.progress.positions)
        for topic in self.app.handlers:
            if (layout := self.services.registry.get(topic)) is not None:
                self.services.adoptions.adopted(self.name, topic, layout.epoch)
        if events.revoked:  # flush the keys' state, then commit at once: other members wait for it
            await self.dispatcher.fire(self.app.keys_revoked_callbacks, by_processor(self.admission, events.revoked))
            self._next_checkpoint = 0.0
        if events.assigned:
            await self.dispatcher.fire(self.app.keys_assigned_callbacks, by_processor(self.admission, events.assigned))

    async def _read_left_history(self) -> bool:
        """Each hosted processor reads what it lacks of partitions it no longer consumes
        (``CatchUp.read_left_history``), now that a layout changed. False: not now (between
        generations; the next regate tries again)."""
        assignment = self.assignor.assignment
        if assignment is None or self.assigned_generation != self.generation:
            return False
        stamp = self._stamp(self.assigned_generation)
        for proc in self.processors.values():
            owned = [(tp.topic, tp.partition) for tp, r in self.admission if r.proc is proc and not r.swept]
            handled = self._handled_before.get(proc.id)
            await self.catchup.read_left_history(proc, stamp, assignment.p0, self.job_p, owned, handled)
        return True

    # -- the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        consumer = self.consumer
        settings = self.app.settings
        lock = self.services.lock
        wall_closes = settings.close_on == "wall"
        while not self._stopping:
            self.awaiting_records = True
            try:
                queued = [r for _, r in self.admission if r.scheduler is not None and r.scheduler.queued]
                batch = await consumer.getmany(
                    timeout_ms=0 if queued else 100 if self.admission.gated or self.merge.held else 200,
                    max_records=settings.max_batch_records,
                )
            finally:
                self.awaiting_records = False
            if self.fatal is not None:
                raise self.fatal
            if batch or queued or self.merge.held:
                async with lock:
                    await self._handle(batch)
            now = time.monotonic()
            if self._regate_needed or (self.admission.gated and now >= self._next_gate_poll):
                self._next_gate_poll = now + GATE_POLL_SECONDS
                async with lock:
                    if self.admission.gated:
                        await self.services.progress.refresh()
                    await self._regate()
            if wall_closes and now >= self._next_wall_tick and self.processors:
                self._next_wall_tick = now + WALL_TICK_SECONDS
                async with lock:
                    wall_ms = int((time.time() - settings.close_allowance) * 1000)
                    if await self.dispatcher.tick_wall(self.serving(), wall_ms):
                        await self.dispatcher.send_output()
            if self.processors and (
                self._since_checkpoint >= settings.commit_every
                or now >= self._next_checkpoint
                or self._dirty_keys() >= settings.checkpoint_dirty_keys
            ):
                async with lock:
                    await self._checkpoint()
                collector.settle()
                self.services.beat()
                self._since_checkpoint = 0
                self._next_checkpoint = time.monotonic() + settings.commit_interval

    def _dirty_keys(self) -> int:
        """The keys the hosted processors changed since the last checkpoint: what the next
        one writes (it commits every processor at once), so its pause."""
        return sum(c.dirty_count for p in self.processors.values() for c in p.caches.values())

    async def _go_live_if_caught_up(self, proc: ProcessorState) -> None:
        """A shrink's merged processor (``sides``) goes live once none of its partitions
        has records left that the group handled already (``rebuild_until``), none held by
        the time-ordered merge or a key-concurrent handler either (``stable``): before,
        each key set closes on its own stream time, as its old owner did."""
        if proc.sides is not None and rebuilt_all(proc, self.admission):
            await self.dispatcher.go_live(proc)

    async def _handle(self, batch: dict[TopicPartition, list[Any]]) -> None:
        merge = self.merge
        merge.set_inputs(merged_inputs(self.admission))
        for tp, fetched in batch.items():
            for route, records in self.admission.admit(tp, fetched):
                await apply_merged(merge, self.dispatcher, route, records, self._lagging)
                route.position = records.next_position  # held or key-concurrent: what is not applied is pending
                route.proc.uncommitted += records.consumed
                self._since_checkpoint += records.consumed
        await release_merged(merge, self.dispatcher, self._lagging)
        for proc in self.processors.values():
            if proc.sides is not None:  # (a shrink's merged processor only: the loop's hot path)
                await self._go_live_if_caught_up(proc)
        if merge.inputs:
            self.held_back.update(merge, self.admission)
        for _, route in self.admission:  # key-concurrent routes' records of busy keys
            if route.scheduler is not None and route.scheduler.queued:
                await self.dispatcher.run_queued(route)
        await self.dispatcher.send_output()
        if await catch_up_epochs(self.admission, self.services.registry):
            await self._regate()

    async def _checkpoint(self) -> None:
        started = time.perf_counter()
        try:
            committed = await checkpointing.checkpoint(
                member=self.name,
                generation=self.assigned_generation,
                layout_epochs=self.layout_epochs,
                processors=self.processors.values(),
                slots=[
                    checkpointing.Slot(
                        tp,
                        r.proc,
                        r.committed,
                        r.sharers,
                        r.swept,
                        max(r.forwarded, default=-1) + 1,
                        self._kafka_offsets.get(tp, -1),
                    )
                    for tp, r in self.admission
                ],
                progress=self.services.progress,
                flush_output=self.services.output.flush,
                commit_offsets=self._commit_offsets,
                extra={"p": self.job_p},
                changelog=self.services.changelog,
            )
        except checkpointing.ZombieCheckpointError as exc:
            self.zombie_rejections += 1
            log.error("%s: %s; dropping uncommitted state and rejoining", self.name, exc)
            self._close_all(discard=True)
            self.consumer._coordinator.request_rejoin()
            return
        for tp, route in self.admission:
            route.committed = committed.get((tp, route.proc.id), route.committed)
        self.checkpoint_seconds.observe(time.perf_counter() - started)

    async def _commit_offsets(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        await self.consumer.commit(offsets)
        self._kafka_offsets.update((tp, o.offset) for tp, o in offsets.items())

    def _standby_info(self, info: MemberInfo) -> None:
        """What the leader places standbys by: this worker's disk and the stores it holds."""
        keeper = self.services.standbys
        assert keeper is not None
        info.disk = keeper.disk
        info.copies = keeper.positions(hosted=self.processors)
        for pid, proc in self.processors.items():  # its actives: the furthest copies there are
            if (at := position_of(proc.loaded)) is not None:
                info.copies[pid] = at

    def request_stop(self) -> None:
        """Leave the loop after the current batch."""
        self._stopping = True

    async def stop(self, checkpoint: bool = True) -> None:
        """Checkpoint (unless told not to: after a failure mid-batch), close stores, leave."""
        async with self.services.lock:
            self._stopping = True
            if self.processors and checkpoint:
                await self.dispatcher.fire(self.app.keys_revoked_callbacks, by_processor(self.admission))
                await self._checkpoint()
            self._close_all(discard=not checkpoint)
        self.services.adoptions.unregister(self.name)
        await self.consumer.stop()
