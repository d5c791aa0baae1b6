"""The autoscaler's policy: from what a job measured, how many workers it should have, and
why. Pure: no broker, no clock of its own (each ``Sample`` carries its time), so a
recorded history gives the same decisions every time (``streamkit autoscale --dry-run``).

In the spirit of Flink's autoscaler:

- a worker's true capacity is what the job applied per second divided by the share of
  the time its workers spent in handlers, in the time its checkpoints leave (they cost
  about as much whatever the load, so counted as busy they would make a lightly loaded
  worker look slow);
- the job needs capacity for its input rate at the target utilization, plus its backlog
  drained within the catch-up time;
- it scales out as soon as it needs more workers than it has (to as many as it needs);
- it scales in only after ``stabilization`` seconds in which every sample needed fewer,
  one worker at a time;
- never while a scale, a bootstrap, a restore or a rebalance is under way (the sample is
  not ``settled``); after a refused scale it waits ``retry_after`` seconds, and says so;
- within ``min_workers`` and ``max_workers``; processors follow the workers (one each),
  never below the job's initial processor count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Decision", "Limits", "Policy", "Sample"]


@dataclass(frozen=True)
class Sample:
    """What the job measured over the interval ending at ``at``."""

    at: float
    """Seconds (any origin: only differences count)."""
    workers: int
    """Worker processes alive."""
    processors: int
    input_rate: float
    """Records/s written to the input topics."""
    applied_rate: float
    """Records/s the job applied."""
    lag: int
    """Records written and not applied yet, over every input partition."""
    busy: float
    """Share of the wall time the workers spent in handlers (0..1), averaged over the workers."""
    settled: bool = True
    """No scale, bootstrap, restore or rebalance under way."""
    checkpointing: float = 0.0
    """Share of the wall time the workers spent checkpointing (0..1), averaged."""
    measured: int = 0
    """Workers whose busy and checkpointing shares were measured (in both looks; 0: all)."""


@dataclass(frozen=True)
class Limits:
    """The controller's bounds and knobs (``streamkit autoscale`` options)."""

    min_workers: int
    max_workers: int
    initial_processors: int
    """The job's initial processor count: processors never go below it."""
    target_utilization: float = 0.7
    catch_up: float = 60.0
    """Seconds to drain a backlog in."""
    stabilization: float = 60.0
    """Seconds of lower need before a scale-in."""
    retry_after: float = 30.0
    """Seconds after a refused scale before the next try."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.max_workers:
            raise ValueError(f"min {self.min_workers} and max {self.max_workers} workers: need 1 <= min <= max")
        if not 0 < self.target_utilization <= 1:
            raise ValueError(f"target utilization {self.target_utilization}: need 0 < u <= 1")
        if not (math.isfinite(self.catch_up) and self.catch_up > 0):
            raise ValueError(f"--catch-up {self.catch_up}: need a number of seconds > 0")
        for option, seconds in (("--stabilization", self.stabilization), ("--retry-after", self.retry_after)):
            if not (math.isfinite(seconds) and seconds >= 0):
                raise ValueError(f"{option} {seconds}: need a number of seconds >= 0")


@dataclass(frozen=True)
class Decision:
    """What the controller does after a sample: ``action`` is "out", "in" or "hold"."""

    at: float
    action: str
    workers: int
    """Workers wanted (the current count when holding)."""
    processors: int
    """Processors wanted."""
    why: str
    figures: dict[str, float] = field(default_factory=dict)
    """What the decision used: needed capacity, capacity per worker, workers needed, ..."""

    def line(self) -> str:
        shown = figures_text(self.figures)
        return f"{self.action}: {self.workers} workers, {self.processors} processors: {self.why} ({shown})"


def figures_text(figures: Mapping[str, float]) -> str:
    """A decision's figures in one line: "input/s 900.00, lag 1,200.00, ..."."""
    return ", ".join(f"{k} {v:,.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items())


class Policy:
    """Decisions from samples, one at a time (see the module docstring)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._lower_since: float | None = None
        """Since when every sample needed fewer workers than there were."""
        self._refused_at: float | None = None
        self._refused_why = ""

    def refused(self, at: float, why: str) -> None:
        """A scale the controller asked for was refused at ``at`` (why): no new one before
        ``retry_after`` seconds."""
        self._refused_at, self._refused_why = at, why

    def restart_stabilization(self) -> None:
        """Lower need seen so far no longer counts towards a scale-in (the looks stopped a
        while): it must be seen again for a whole stabilization time."""
        self._lower_since = None

    def pausing(self, at: float) -> bool:
        """Whether a refused scale's pause is still on at ``at``."""
        return self._refused_at is not None and at - self._refused_at < self.limits.retry_after

    def decide(self, s: Sample) -> Decision:
        lim = self.limits
        needed, per_worker, wanted = self._needed(s)
        figures = {
            "input/s": s.input_rate,
            "applied/s": s.applied_rate,
            "lag": float(s.lag),
            "busy": s.busy,
            "checkpointing": s.checkpointing,
            "capacity/worker": per_worker,
            "needed/s": needed,
            "workers needed": float(wanted),
        }
        target = min(lim.max_workers, max(lim.min_workers, wanted))

        def hold(why: str) -> Decision:
            return Decision(s.at, "hold", s.workers, s.processors, why, figures)

        if not s.settled:
            self._lower_since = None
            return hold("a scale, bootstrap, restore or rebalance is under way")
        if self.pausing(s.at):
            return hold(f"the last scale was refused ({self._refused_why}): retrying after {lim.retry_after:.0f} s")
        if target > s.workers:
            self._lower_since = None
            why = "backlog" if s.lag / lim.catch_up > s.input_rate * 0.1 else "load"
            why = f"{why}: needs {wanted} workers" if wanted >= lim.min_workers else f"--min {lim.min_workers} workers"
            return self._to(s, "out", target, why, figures)
        if target >= s.workers:
            self._lower_since = None
            return hold("capacity matches the load")
        if self._lower_since is None:
            self._lower_since = s.at
        if s.at - self._lower_since < lim.stabilization:
            return hold(f"needs fewer workers for {s.at - self._lower_since:.0f} s of {lim.stabilization:.0f}")
        self._lower_since = None
        return self._to(s, "in", s.workers - 1, f"needed fewer for {lim.stabilization:.0f} s", figures)

    def _needed(self, s: Sample) -> tuple[float, float, int]:
        """Records/s needed, capacity per worker, and workers needed (at least 1)."""
        lim = self.limits
        needed = s.input_rate / lim.target_utilization + s.lag / lim.catch_up
        if s.busy <= 0 or s.applied_rate <= 0 or s.workers <= 0:
            # nothing applied: no capacity to measure; a backlog keeps what there is
            return needed, math.inf, s.workers if s.lag > 0 else 1  # (``--min`` is applied after)
        measured = s.measured or s.workers  # (a worker that just started applied nothing yet)
        per_worker = s.applied_rate / min(1.0, s.busy) / measured * max(0.1, 1.0 - s.checkpointing)
        return needed, per_worker, max(1, math.ceil(needed / per_worker))

    def _to(self, s: Sample, action: str, workers: int, why: str, figures: dict[str, float]) -> Decision:
        processors = max(self.limits.initial_processors, workers)
        return Decision(s.at, action, workers, processors, why, figures)
