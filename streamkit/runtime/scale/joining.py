"""A scale change's next step, on the member that hosts the processor it comes from:
open the store to bootstrap (a joining processor's own, or a shrink's staging store),
bootstrap it beside the member's loop (``scale.bootstrap``), then hand the partitions
over in place, or ask the group for a rebalance when that cannot be done here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiokafka import TopicPartition

from assignors.group import place_job
from streamkit.app import App
from streamkit.runtime.dispatch import by_processor
from streamkit.runtime.group_consumer import PauseControl
from streamkit.runtime.jobmeta import Bootstrap, JobLayout
from streamkit.runtime.key_sets import adopt_windows, open_for_count, purge_moved_keys, staging_path
from streamkit.runtime.parts import MemberParts
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.rebuild import Pace
from streamkit.runtime.routing import Starts
from streamkit.runtime.scale.bootstrap import bootstrap_step, seed_from_changelog
from streamkit.runtime.scale.staging_seed import StagingSeed
from streamkit.runtime.services import Services
from streamkit.runtime.task import Task
from streamkit.runtime.tasks import TaskManager
from streamkit.state.restore import ChangelogSource

log = logging.getLogger(__name__)

__all__ = ["Joining"]


class OwnerHold:
    """The final stretch of a bootstrap that does not gain on its keys' owner (the member's
    loop and the bootstrap share one process): the owner's partitions here wait until the
    handover is done. All of them, or none if another processor hosted here reads one of
    them too. They count as lagging while they wait (``merging.consumer_lagging``): the
    records the owner's merge holds wait with them."""

    def __init__(self, control: PauseControl, tasks: TaskManager, owners: tuple[int, ...]) -> None:
        self.control, self.tasks, self.owners = control, tasks, owners
        self.held: list[TopicPartition] = []

    def __call__(self) -> bool:
        """Hold the owners' partitions; whether it could."""
        owners = {pid: task for pid, task in self.tasks.active.items() if pid in self.owners}
        mine = [tp for task in owners.values() for tp in task.routes]
        others = {tp for pid, task in self.tasks.active.items() if pid not in self.owners for tp in task.routes}
        if not mine or others & set(mine):
            return False
        self.held = mine
        self.control.pause(*mine)
        return True

    def release(self) -> None:
        """The owners' partitions go on (those the handover moved: with their new owner)."""
        if self.held:
            self.control.resume(*self.held)
            self.held = []


class Joining:
    """The joining processors a member hosts and their bootstraps (see the module docstring)."""

    def __init__(self, app: App, services: Services, parts: MemberParts, tasks: TaskManager) -> None:
        self.app = app
        self.services = services
        self.parts = parts
        self.tasks = tasks
        self.name = parts.name
        self._joining: dict[int, tuple[ProcessorState, asyncio.Task[None]]] = {}
        """A processor joining the job, hosted beside the one that splits (no rebalance)."""
        self.progress: dict[int, dict[str, int]] = {}
        """Bootstrap progress of the joining processors hosted here (status)."""
        self._failures = 0
        """Bootstraps started here that failed (each rejoin to retry waits longer)."""
        self._tasks: set[asyncio.Task[None]] = set()
        tasks.on_close.append(self.close)

    def close(self) -> None:
        """Every processor is being closed: so are the joining ones (their bootstrap waits
        for the lock the closer holds, or fetches)."""
        for joining, task in self._joining.values():
            task.cancel()
            joining.close()
        self._joining.clear()
        self.progress.clear()

    def on_job_change(self, job: JobLayout) -> None:
        """The next step of a scale change starts its bootstrap beside the processor it
        comes from, with no rebalance."""
        if job.bootstrap is not None and self.tasks.assigned_generation >= 0:
            task = asyncio.create_task(
                self._host_locked(job, self.tasks.assigned_generation),
                name=f"the store of joining processor {job.bootstrap.pid}",
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(self._ended)  # opening its store failed: the same

    async def _host_locked(self, job: JobLayout, generation: int) -> None:
        async with self.services.lock:
            if generation == self.tasks.assigned_generation:  # no rebalance meanwhile
                await self.host(job, generation)

    async def host_for(self, generation: int) -> None:
        """After an assignment (lock held): host the scale change's next step if it comes
        from a processor now hosted here."""
        await self.host(self.services.jobs.job, generation)

    async def host(self, job: JobLayout, generation: int) -> None:
        """If this member hosts the processor that the scale change's next step comes from,
        open the store to bootstrap here and start the bootstrap: a joining processor's own
        store, or the receiving processor's staging store. Call with the lock held."""
        step = job.bootstrap
        if step is None or step.pid in self._joining or step.beside not in self.tasks.processors:
            return
        path = self.app.store_path(step.pid, self.app.settings.state_dir)
        opening = self.tasks.opening(job.incarnation)
        where = staging_path(path) if step.staging else path
        proc = await open_for_count(step.pid, where, opening, job.p0, step.count, log_as=self.name)
        if step.staging:  # two processors' keys, each on its own stream time until it goes live
            proc.hold_sides(job.p0, step.count + 1)
        info = self.parts.assignor.info
        info.hosted = sorted({*info.hosted, step.pid})  # keep it here at the handover
        task = asyncio.create_task(
            self._bootstrap(proc, job, step, generation), name=f"bootstrap of processor {step.pid}"
        )
        task.add_done_callback(self._ended)
        self._joining[step.pid] = (proc, task)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A bootstrap that failed is said, and retried after a rebalance (which closes it):
        left alone, the scale change would wait for it for ever."""
        if task.cancelled() or task.exception() is None:
            return
        self._failures += 1
        delay = min(2.0**self._failures, 60.0)  # one that fails every time: not a rebalance storm
        log.error("%s: %s failed (%s: %s); rejoining the group in %.0f s to start it again", self.name,
                  task.get_name(), type(task.exception()).__name__, task.exception(), delay,
                  exc_info=task.exception())  # fmt: skip
        asyncio.get_running_loop().call_later(delay, self._rejoin_unless_stopping)

    def _rejoin_unless_stopping(self) -> None:
        if not self.tasks.stopping:
            self.parts.consumer.request_rejoin()

    async def _bootstrap(self, proc: ProcessorState, job: JobLayout, step: Bootstrap, generation: int) -> None:
        """Bootstrap ``proc`` for the step of ``job``'s scale change beside the member's loop
        (``job``: the one the step comes from, which the job watcher may not have read yet)."""

        def report(progress: dict[str, int]) -> None:
            self.progress[proc.id] = progress
            self.services.beat()  # status shows it now, not at the next heartbeat

        s = self.app.settings
        pace = Pace(
            self.tasks.stamp(generation), s.commit_every, lock=self.services.lock,
            checkpoint_interval=s.commit_interval, max_rate=s.bootstrap_rate,
        )  # fmt: skip
        seed = self._changelog_seed(proc, job, step, generation)
        owners = (step.beside, step.count) if step.staging else (step.beside,)
        hold = OwnerHold(self.parts.consumer.control("a bootstrap's final stretch"), self.tasks, owners)
        try:
            stepped = await bootstrap_step(proc, job, step, self.parts.catchup, pace, report, seed, hold)
            if stepped is not None:
                await self._hand_over(proc, step, stepped, generation)
        finally:
            hold.release()

    async def _hand_over(self, proc: ProcessorState, step: Bootstrap, stepped: JobLayout, generation: int) -> None:
        """The step's handover: in place when it can be done here, else by a rebalance."""
        async with self.services.lock:
            try:
                if step.staging:
                    done = await self._shrink_in_place(proc, step, stepped, generation)
                else:
                    done = await self._hand_over_in_place(proc, step.beside, stepped, generation)
            except Exception:  # noqa: BLE001 - the rebalance below hands over from the stores
                log.exception("%s: the handover of processor %d in place failed", self.name, proc.id)
                self.tasks.close_all()
                done = False
            if not done:
                log.info("%s: job epoch %d has %d processors: rebalancing", self.name, stepped.epoch, stepped.p)
                self.parts.assignor.info.p = stepped.p
                self.parts.consumer.request_rejoin()
            elif self.services.standbys is not None:  # the leader places the processors' copies
                log.info("%s: processor %d %s: rebalancing to place its standbys", self.name, proc.id,
                         "took the retiring processor's keys" if step.staging else "joined")  # fmt: skip
                self.parts.consumer.request_rejoin()
            elif not step.staging and stepped.bootstrap is None and (members := self._piled_up(stepped.p)):
                log.info("%s: processor %d joined in place; this worker hosts %d of %d processors, more than its "
                         "share among %d: rebalancing to spread them", self.name, proc.id, len(self.tasks.active),
                         stepped.p, members)  # fmt: skip
                self.parts.consumer.request_rejoin()

    def _piled_up(self, p: int) -> int | None:
        """The group's member count if this member hosts more than its share of ``p``
        processors (a growth in place adds the joined one here: the other workers, a new
        one the autoscaler started among them, would stay idle until some rebalance).
        Asked after the last step of a growth only: a rebalance would restart the next
        step's bootstrap."""
        assignment = self.parts.assignor.assignment
        members = assignment.members if assignment is not None else 1
        return members if len(self.tasks.active) > -(-p // members) else None

    def _changelog_seed(
        self, proc: ProcessorState, job: JobLayout, step: Bootstrap, generation: int
    ) -> Callable[[], Awaitable[bool]] | None:
        """A bootstrap's start from changelogs (None: the job has no changelog): a joining
        processor's from its source's, a shrink's staging store from those of the two
        processors it merges (``staging_seed``)."""
        changelog = self.services.changelog
        if changelog is None:
            return None
        source = self.tasks.processors.get(step.beside)
        seeds = ChangelogSource(self.services.io, changelog.topic, self.app.tables, job.p0, job.incarnation)
        if step.staging:
            seed = StagingSeed(
                self.parts.catchup, seeds, self.services.lock, self.tasks.stamp(generation), self.services.memory
            )
            return lambda: seed(proc, source, step.count)
        return lambda: seed_from_changelog(proc, source, seeds, step.count, self.name)

    async def _hand_over_in_place(self, joined: ProcessorState, split: int, job: JobLayout, generation: int) -> bool:
        """A growth step whose splitting processor is hosted here, beside the joined one:
        move the joined processor's partitions from the splitting one to it inside this
        member, with no group rebalance (the member keeps fetching the same partitions).
        The splitting processor checkpoints first (its positions are T1); the joined one
        replays from its bootstrap's positions to T1 without output and goes on with output.
        False if it cannot be done here (the member lost the processor, or a partition of
        theirs is shared with a processor elsewhere): the caller asks for a rebalance.
        Call with the lock held."""
        tasks, parts = self.tasks, self.parts
        old_task = tasks.active.get(split)
        if generation != tasks.assigned_generation or old_task is None:
            return False
        old = old_task.proc
        placed = place_job(await parts.catchup.shapes(), job.p0, job.p)
        if not placed.shared_only_among((split, joined.id)):
            return False
        moving = list(old_task.routes)
        await parts.dispatcher.fire(self.app.keys_revoked_callbacks, {old: moving})
        await tasks.checkpoint()  # its positions are T1; a zombie's is refused and it lets go of everything
        if generation != tasks.assigned_generation or tasks.active.get(split) is not old_task:
            return False
        tasks.let_go(old_task)  # what its routes had not finished goes back to the checkpoint: refetched
        self._joining.pop(joined.id, None)
        self.progress.pop(joined.id, None)
        hosted = (tasks.host(old), tasks.host(joined))
        tasks.job_p = parts.assignor.info.p = job.p
        parts.assignor.info.hosted = sorted(tasks.active)
        stamp = tasks.stamp(generation)
        owned = [(t, q) for t, q, _ in placed.slots.get(joined.id, [])]
        if joined.window_states:  # from T1 on its keys' windows close as the old owner's did
            await parts.catchup.rebuild(joined, stamp, job.p0, job.p)
            sealed = [tp for tp in joined.loaded.positions if tp not in owned]  # (a grown topic's old partitions)
            adopt_windows(joined, old, self.app.tables, job.p0, job.p, read_to_seal=sealed)
            await hosted[1].adopt_stream_time(min(old.stream_time, old.fired_through))
        purged = purge_moved_keys(old, self.app.tables, job.p0, job.p)
        # below a seal, the joined processor's keys past where the old owner got are its own now
        handled = tasks.handled_before[joined.id] = dict(old.positions)
        await parts.catchup.read_left_history(joined, stamp, job.p0, job.p, owned, handled)
        starts = Starts()
        for task in hosted:
            starts.update(parts.router.slots(task, placed.slots.get(task.id, []), placed.sharers, job.p0, job.p))
            starts.update(parts.router.sweeps(task, placed.sweeps.get(task.id, [])))
        await self._resume(moving, starts, hosted[1], generation)
        log.info("%s: processor %d took over its partitions from processor %d in place (no rebalance); "
                 "processor %d: %d keys moved to it, deleted", self.name, joined.id, split, split, purged)  # fmt: skip
        return True

    async def _shrink_in_place(self, staging: ProcessorState, step: Bootstrap, job: JobLayout, generation: int) -> bool:
        """A shrink step whose receiving and retiring processors are both hosted here: both
        checkpoint (their positions are T1) and let go, the staging store replaces the
        receiving processor's store (``adopt_store``) and the receiving processor takes
        every partition of the two inside this member, as an assignment would (it replays
        from the staging store's positions to T1 without output, its key sets on their own
        stream times until it goes live), with no group rebalance; the retiring processor's
        store is deleted. False if it cannot be done here (the member lost one of them,
        or a partition of the receiving processor is shared with a processor elsewhere):
        the caller asks for a rebalance. Call with the lock held."""
        tasks, parts = self.tasks, self.parts
        receiving, retiring = tasks.active.get(step.pid), tasks.active.get(job.p)
        if generation != tasks.assigned_generation or receiving is None or retiring is None:
            return False
        placed = place_job(await parts.catchup.shapes(), job.p0, job.p)
        if not placed.shared_only_among((step.pid,)):
            return False
        moving = [*receiving.routes, *retiring.routes]
        revoked = {receiving.proc: list(receiving.routes), retiring.proc: list(retiring.routes)}
        await parts.dispatcher.fire(self.app.keys_revoked_callbacks, revoked)
        await tasks.checkpoint()  # their positions are T1; a zombie's is refused and it lets go of everything
        now = (tasks.active.get(step.pid), tasks.active.get(job.p))
        if generation != tasks.assigned_generation or now != (receiving, retiring):
            return False
        for task in (receiving, retiring):
            tasks.let_go(task)  # what its routes had not finished goes back to the checkpoint: refetched
            task.close()
        self._joining.pop(step.pid, None)
        self.progress.pop(step.pid, None)
        staging.close()  # (its directory becomes the receiving processor's store)
        tasks.job_p = parts.assignor.info.p = job.p
        starts = await tasks.take_in_place(step.pid, placed, job.p0, job.p, generation)
        parts.assignor.info.hosted = sorted(tasks.active)
        if starts is None:
            return True  # the history to catch up from is gone: ``fatal`` stops the worker
        await self._resume(moving, starts, tasks.active[step.pid], generation)
        tasks.delete_retired(job)
        log.info("%s: processor %d took over the keys of retiring processor %d in place (no rebalance)",
                 self.name, step.pid, job.p)  # fmt: skip
        await self.host(job, generation)  # the next step, if it comes from here (no rebalance will start it)
        return True

    async def _resume(self, moving: list[TopicPartition], starts: Starts, taker: Task, generation: int) -> None:
        """The end of a handover in place: the moved partitions fetched again from where their
        routes start, the starts recorded, ``taker``'s keys_assigned callbacks, the gates."""
        parts = self.parts
        for tp in moving:
            parts.consumer.seek(tp, parts.admission.fetch_position(tp))
        await self.tasks.mark_attempts()
        await parts.router.record(self.name, generation, self.tasks.layout_epochs, starts)
        await parts.dispatcher.fire(self.app.keys_assigned_callbacks, by_processor(taker.routes.items()))
        await self.tasks.regate()
