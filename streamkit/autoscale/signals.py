"""What the autoscaler measures, from what a job already publishes: one look at the cluster
(``streamkit.cli.status_view.gather``: the group's committed offsets and the high
watermarks of every input partition, the workers' heartbeats, the job record) after
another, and the differences between two looks.

- input rate: records/s by which the high watermarks grew;
- applied rate: records/s the workers handled (their heartbeats' running counts);
- lag: records between committed offsets and high watermarks, and in seconds, the age of
  the oldest record not applied (its timestamp) per partition;
- busy: per worker, the share of the wall time it spent in handlers, and the share it
  spent checkpointing (``WorkerStatus.handler_s``, ``checkpoint_s``: running totals),
  each averaged over the live workers;
- settled: no scale step, bootstrap, restore or rebalance under way (``unsettled``).

Rates are taken over at least ``window`` seconds (the newest look against the newest one
that old): heartbeats come every 2 s and commits at the commit interval, so between two
looks a second apart a running count may not move at all.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamkit.autoscale.journal import Entry
from streamkit.autoscale.policy import Decision, Limits, Policy, Sample

if TYPE_CHECKING:
    from streamkit.app import App
    from streamkit.cli.status_view import Gathered
    from streamkit.connection import Connection

WINDOW = 10.0
"""Seconds at least between the two looks a sample compares (``Sampler``)."""

__all__ = ["Look", "Sampler", "as_record", "entry_of", "look_of", "replay", "sample_between"]


@dataclass(frozen=True)
class Look:
    """The figures of one look at the cluster that the next one is compared with."""

    at: float
    high: int
    """Sum of the input partitions' high watermarks."""
    committed: int
    """Sum of the group's committed offsets (0 where none yet)."""
    handler_s: dict[str, float]
    """Per live worker, its running total of seconds in handlers."""
    checkpoint_s: dict[str, float]
    """Per live worker, its running total of seconds checkpointing."""
    handled: dict[str, int]
    """Per live worker, its running count of records handled."""
    workers: int
    processors: int
    settled: bool
    initial_processors: int = 1
    unsettled: tuple[str, ...] = ()
    lag_by_partition: dict[str, int] = field(default_factory=dict)
    """Per "topic/partition": records not applied yet."""
    lag_seconds: float = 0.0
    """Age of the oldest record not applied, over every input partition (0: none)."""


def look_of(found: Gathered, now: float, oldest_unapplied_ms: int | None = None) -> Look:
    """The figures of one ``gather``; ``oldest_unapplied_ms``: the timestamp of the oldest
    record not applied yet (None: none)."""
    from streamkit.cli.status_view import unsettled

    live = [s for s in found.statuses if s.alive and not s.stale]
    why = unsettled(found.job, found.statuses)
    lags = {f"{t}/{p}": max(0, hw - (c or 0)) for (t, p), (c, hw) in sorted(found.offsets.items())}
    return Look(
        at=now,
        high=sum(hw for _, hw in found.offsets.values()),
        committed=sum(c or 0 for c, _ in found.offsets.values()),
        handler_s={s.worker: s.handler_s for s in live},
        checkpoint_s={s.worker: s.checkpoint_s for s in live},
        handled={s.worker: s.handled for s in live},
        workers=len(live),
        processors=found.job.p if found.job is not None else 0,
        settled=not why,
        initial_processors=found.job.p0 if found.job is not None else 1,
        unsettled=tuple(why),
        lag_by_partition=lags,
        lag_seconds=max(0.0, now - oldest_unapplied_ms / 1000) if oldest_unapplied_ms is not None else 0.0,
    )


def sample_between(before: Look, after: Look) -> Sample:
    """The sample of the interval between two looks."""
    dt = max(after.at - before.at, 1e-6)

    def grown(now: Mapping[str, float], then: Mapping[str, float]) -> list[float]:
        """Per worker in both looks, what its running total grew by (a restarted one: left out)."""
        return [v - then[w] for w, v in now.items() if w in then and v >= then[w]]

    def share(now: Mapping[str, float], then: Mapping[str, float]) -> float:
        """Of the wall time, averaged over the workers."""
        shares = [min(1.0, max(0.0, d / dt)) for d in grown(now, then)]
        return sum(shares) / len(shares) if shares else 0.0

    measured = len(grown(after.handler_s, before.handler_s))
    return Sample(
        at=after.at,
        workers=after.workers,
        processors=after.processors,
        input_rate=max(0, after.high - before.high) / dt,
        applied_rate=sum(grown(after.handled, before.handled)) / dt,
        lag=sum(after.lag_by_partition.values()),
        busy=share(after.handler_s, before.handler_s),
        checkpointing=share(after.checkpoint_s, before.checkpoint_s),
        settled=before.settled and after.settled,
        measured=measured,
    )


class Sampler:
    """Looks at a job's cluster and gives one ``Sample`` per look after the first."""

    def __init__(self, app: App, bootstrap: Connection, window: float = WINDOW) -> None:
        from streamkit.cli.status_view import DeadLetterCounts, Heartbeats

        self.app = app
        self.bootstrap = bootstrap
        self.window = window
        self._dead = DeadLetterCounts()
        self._beats = Heartbeats(app.name)
        self.looks: deque[Look] = deque()

    def restart(self) -> None:
        """Forget the looks so far (they stopped a while): the next sample is taken over
        looks from now on."""
        self.looks.clear()

    async def look(self) -> tuple[Look, Sample | None]:
        """Look now; the sample since the last look (None on the first)."""
        from streamkit.cli.status_view import gather

        found = await gather(self.app, self.bootstrap, self._dead, self._beats)
        oldest = await self._oldest_unapplied(found)
        now = time.time()
        look = look_of(found, now, oldest)
        while len(self.looks) > 1 and now - self.looks[1].at >= self.window:
            self.looks.popleft()  # (the oldest kept is the newest at least ``window`` old)
        first = self.looks[0] if self.looks else None
        self.looks.append(look)
        if first is None or now - first.at < self.window:
            return look, None
        sample = sample_between(first, look)
        if not all(seen.settled for seen in self.looks):  # (a scale between the two looks: not settled)
            sample = dataclasses.replace(sample, settled=False)
        return look, sample

    async def _oldest_unapplied(self, found: Gathered) -> int | None:
        """The timestamp of the oldest record not applied yet, over every input partition
        (the record at each partition's committed offset)."""
        from streamkit.kafkaio import KafkaIO

        behind = [(tp, c or 0) for tp, (c, hw) in found.offsets.items() if hw > (c or 0)]
        if not behind:
            return None
        stamps: list[int] = []
        async with KafkaIO(self.bootstrap) as io:
            for (topic, partition), at in behind:
                records, _ = await io.read(topic, partition, at, at + 1, max_bytes=1 << 16)
                stamps += [r.timestamp for r in records[:1] if r.timestamp >= 0]
        return min(stamps, default=None)


def as_record(look: Look, sample: Sample | None, decision: Decision | None) -> dict[str, Any]:
    """One line of a recorded history (``--record``): the look's figures, the sample and
    the decision (``replay`` reads the samples back)."""
    out: dict[str, Any] = {
        "at": look.at,
        "initial_processors": look.initial_processors,
        "lag_by_partition": look.lag_by_partition,
        "lag_seconds": look.lag_seconds,
    }
    if look.unsettled:
        out["unsettled"] = list(look.unsettled)
    if sample is not None:
        out["sample"] = dataclasses.asdict(sample)
    if decision is not None:
        out["decision"] = dataclasses.asdict(decision)
    return out


def entry_of(
    app: str, controller: Mapping[str, Any], look: Look, sample: Sample | None, decision: Decision | None
) -> Entry:
    """The journal record of one look: the look's lag and counts, the sample's rates and
    shares when there is one, and the decision."""
    inputs: dict[str, Any] = {
        "lag": sum(look.lag_by_partition.values()),
        "lag_seconds": round(look.lag_seconds, 3),
        "workers": sample.workers if sample is not None else look.workers,
        "processors": look.processors,
        "settled": look.settled,
        "unsettled": list(look.unsettled),
    }
    if sample is not None:
        for name in ("input_rate", "applied_rate", "busy", "checkpointing"):
            inputs[name] = round(float(getattr(sample, name)), 4)
    shown = None if decision is None else dataclasses.asdict(decision)
    if shown is not None:  # (no capacity measured yet is infinite: JSON has no such number)
        shown["figures"] = {k: v for k, v in shown["figures"].items() if math.isfinite(v)}
    return Entry(app, look.at, dict(controller), inputs, shown)


def replay(lines: Iterable[str], limits: Limits) -> list[Decision]:
    """The decisions a policy with ``limits`` makes on a recorded history (``--record``;
    ``streamkit autoscale --replay``): its samples in order, a refused scale told as it
    was recorded, and so a look that failed. ``limits.initial_processors`` is taken from the
    history."""
    records = [json.loads(line) for line in lines if line.strip()]
    p0 = min((r["initial_processors"] for r in records if "initial_processors" in r), default=1)
    policy = Policy(dataclasses.replace(limits, initial_processors=p0))
    decisions = []
    for r in records:
        if "refused" in r:
            policy.refused(r["at"], r["refused"])
        if "look_failed" in r:  # as the live run: the stabilization time starts again
            policy.restart_stabilization()
        if "sample" in r:
            decisions.append(policy.decide(Sample(**r["sample"])))
    return decisions
