"""The autoscaler's loop: look at the job, decide (``policy``), act, and say so.

Per look (every ``interval`` seconds):

1. a sample of the interval since the last look (``signals.Sampler``);
2. a dead local worker is restarted first (``--workers local``);
3. the policy's decision, printed as one line with the figures it used, and kept (the
   last ones are in ``Controller.decisions`` and the ``autoscale`` gauges), journaled
   with the inputs it used for `status` and the dashboard (``journal``);
4. unless ``dry_run``: out, the workers first, then the processors to match; in, the
   processors first (a live shrink), then one worker less once the job has settled (2);
   a scale the job refuses is reported and told to the policy, which waits before the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from streamkit.autoscale.journal import Entry, JournalWriter
from streamkit.autoscale.policy import Decision, Policy, Sample
from streamkit.autoscale.signals import WINDOW, Look, Sampler, as_record, entry_of

if TYPE_CHECKING:
    from streamkit.app import App
    from streamkit.connection import Connection

__all__ = ["Controller", "WorkerLever"]

log = logging.getLogger(__name__)

KEEP = 600
"""Decisions (and samples) kept for status, one per look."""


class WorkerLever(Protocol):
    """How the controller gets workers: local processes, or a gauge another system reads."""

    @property
    def count(self) -> int: ...
    def scale_to(self, n: int) -> None: ...
    def restart_dead(self) -> list[tuple[int, int]]: ...


class Gauge:
    """``--workers gauge``: the count the controller wants, published as
    ``streamkit_autoscale_desired_workers`` for a HorizontalPodAutoscaler or KEDA to act on
    (it stays at the last scale decided, through the holds that follow); the workers that
    exist are those the job's heartbeats show."""

    def __init__(self) -> None:
        self.desired: int | None = None
        self.seen = 0

    @property
    def count(self) -> int:
        """The workers seen, at most the count published: after a scale-in the cluster
        stops a worker some time later, and until then the processors must not follow the
        one still there back up."""
        return self.seen if self.desired is None else min(self.seen, self.desired)

    def scale_to(self, n: int) -> None:
        self.desired = n

    def restart_dead(self) -> list[tuple[int, int]]:
        return []


@dataclass
class Controller:
    """See the module docstring. ``request_scale(n)``: start scaling the job's processors
    to ``n`` (raises with the job's reason when it refuses)."""

    app: App
    bootstrap: Connection
    policy: Policy
    workers: WorkerLever
    request_scale: Callable[[int], Any]
    dry_run: bool = False
    record: Path | None = None
    interval: float = 5.0
    window: float = WINDOW
    say: Callable[[str], None] = print
    journal: JournalWriter | None = None
    """Where each look's inputs and decision are published (None: nowhere)."""
    about: dict[str, Any] = field(default_factory=dict)
    """Who decides under which bounds, as the journal shows it (``journal.controller_info``)."""
    decisions: deque[Decision] = field(default_factory=lambda: deque(maxlen=KEEP))
    samples: deque[Sample] = field(default_factory=lambda: deque(maxlen=KEEP))
    scales: int = 0
    """Scale operations started (processors or workers)."""
    pending_workers: int | None = None
    """A scale-in's worker count, once the processors' shrink has settled."""

    def resume(self, journal: list[Entry]) -> str | None:
        """A restarted controller goes on from its journal (its records of the last minutes,
        oldest first): the gauge at the count last decided (published anew as the workers
        running, it would have the cluster stop the workers it was starting), and a refused
        scale's pause. What it took up, in a line (None: nothing)."""
        mine = [e for e in journal if not e.controller.get("dry_run")]
        taken = []
        decided = [e for e in mine if e.decision and e.decision.get("action") in ("out", "in") and not e.refused]
        if decided and isinstance(self.workers, Gauge):
            limits, decision = self.policy.limits, decided[-1].decision or {}
            self.workers.desired = min(max(int(decision["workers"]), limits.min_workers), limits.max_workers)
            taken.append(f"the gauge at {self.workers.desired} workers (decided {decision['action']})")
        if refusals := [e for e in mine if e.refused]:
            self.policy.refused(refusals[-1].at, refusals[-1].refused or "")
            taken.append(f"a refused scale's pause ({refusals[-1].refused})")
        return f"resumed from the journal: {', '.join(taken)}" if taken else None

    async def run(self, stop: asyncio.Event, sampler: Sampler | None = None) -> None:
        """Look, decide and act every ``interval`` seconds until ``stop``; a look that fails
        (the broker away a moment) is reported in one line and the next one tried, with
        the rates and the stabilization time started again (``sampler``: the job's)."""
        sampler = sampler if sampler is not None else Sampler(self.app, self.bootstrap, self.window)
        while not stop.is_set():
            try:
                await self.step(sampler)
            except Exception as exc:  # noqa: BLE001 - the controller outlives a failed look
                self.say(f"look failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                         f"trying again in {self.interval:.0f} s")  # fmt: skip
                sampler.restart()  # (rates across the gap would average it in, and a scale-in
                self.policy.restart_stabilization()  # be taken on a stabilization time with no look in it)
                self._record({"at": time.time(), "look_failed": type(exc).__name__})  # (``--replay`` does the same)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await stop.wait()

    async def step(self, sampler: Sampler) -> Decision | None:
        """One look, decision and action (see the module docstring)."""
        look, sample = await sampler.look()  # 1
        if isinstance(self.workers, Gauge):
            self.workers.seen = look.workers
            if self.workers.desired is None:
                limits = self.policy.limits
                self.workers.desired = min(max(look.workers, limits.min_workers), limits.max_workers)
        if not self.dry_run:  # 2
            for pid, code in await asyncio.to_thread(self.workers.restart_dead):
                self.say(f"worker {pid} exited with status {code}: started another")
            if self.pending_workers is not None and look.settled:
                await asyncio.to_thread(self.workers.scale_to, self.pending_workers)
                self.pending_workers = None
        if sample is not None and not self.dry_run:  # (a worker started shows in the heartbeats a little later)
            sample = dataclasses.replace(sample, workers=max(sample.workers, self.workers.count))
        decision = self.policy.decide(sample) if sample is not None else None  # 3
        if decision is not None and self._waiting_for_workers(decision, look):
            why = f"waiting for the cluster to start workers: {decision.workers} wanted, {look.workers} running"
            decision = dataclasses.replace(decision, action="hold", why=why)
        self._record(as_record(look, sample, decision))
        await self._publish(entry_of(self.app.name, self.about, look, sample, decision))
        if sample is None or decision is None:
            return None
        self.samples.append(sample)
        self.decisions.append(decision)
        self.say(f"{'would ' if self.dry_run and decision.action != 'hold' else ''}{decision.line()}")
        if not self.dry_run and decision.action != "hold":
            await self._act(decision, look)  # 4
        elif not self.dry_run:
            await self._processors_in_step(look)
        return decision

    def _waiting_for_workers(self, decision: Decision, look: Look) -> bool:
        """A scale-out already published on the gauge and the processors already there: the
        cluster has yet to start the workers (deciding it again each look would be noise)."""
        return (
            isinstance(self.workers, Gauge)
            and decision.action == "out"
            and self.workers.desired == decision.workers
            and look.processors >= decision.processors
        )

    async def _processors_in_step(self, look: Look) -> None:
        """At least one processor per worker there is (never below the initial count): a
        scale-out whose processor step was refused is caught up once the pause is over, and
        with ``--workers gauge`` the processors follow the workers the cluster started."""
        limits = self.policy.limits
        want = max(limits.initial_processors, min(self.workers.count, limits.max_workers))
        if want <= look.processors or not look.settled or self.pending_workers is not None:
            return
        if self.policy.pausing(look.at):
            return
        self.say(f"processors to {want}: one per worker")
        step = Decision(look.at, "out", self.workers.count, want, "processors to one per worker")
        await self._scale(lambda: self.request_scale(want), look, step, between_looks=True)

    async def _act(self, d: Decision, look: Look) -> None:
        async def act() -> None:
            if d.action == "out":
                await asyncio.to_thread(self.workers.scale_to, d.workers)
                if d.processors > look.processors:
                    await self.request_scale(d.processors)
            elif d.processors < look.processors:  # the processors first: a worker stops once they settled
                await self.request_scale(d.processors)
                self.pending_workers = d.workers
            else:
                await asyncio.to_thread(self.workers.scale_to, d.workers)

        await self._scale(act, look, d)

    async def _scale(self, act: Callable[[], Any], look: Look, decision: Decision, between_looks: bool = False) -> None:
        """Run one scale action; a refusal is reported, recorded, journaled and told to the
        policy. ``between_looks``: a scale no look decided (journaled on its own when done)."""
        try:
            await act()
            self.scales += 1
            if between_looks:  # (a look's decision is journaled with the look)
                await self._publish(dataclasses.replace(entry_of(self.app.name, self.about, look, None, decision),
                                                        kind="step"))  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - the job's refusal, in its own words
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            at = decision.at
            self.policy.refused(at, reason)
            self._record({"at": at, "refused": reason})
            refusal = entry_of(self.app.name, self.about, look, None, decision)
            await self._publish(dataclasses.replace(refusal, at=at, refused=reason))
            self.say(f"scale refused: {reason}; trying again after {self.policy.limits.retry_after:.0f} s")

    async def _publish(self, entry: Entry) -> None:
        if self.journal is not None:
            await self.journal.write(entry)

    def _record(self, line: dict[str, Any]) -> None:
        """Append one line to the history file (``--record``), if there is one."""
        if self.record is not None:
            with self.record.open("a") as f:
                f.write(json.dumps(line) + "\n")
