"""What `status` and the dashboard show of a job, as plain data: gathered from the
cluster (the job record, layouts, committed offsets and high watermarks, the workers'
heartbeats, the dead letters), then turned into rows (``view``). `status` draws the rows
as tables; the dashboard serves them as JSON."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from assignors.placement import processors_for_partition
from streamkit.app import App
from streamkit.connection import Connection
from streamkit.errors import TopicNotFoundError
from streamkit.kafkaio import KafkaIO
from streamkit.layout.registry import LayoutRegistry
from streamkit.runtime.jobmeta import JobLayout, read_job
from streamkit.runtime.status import WorkerStatus, read_statuses

__all__ = [
    "DeadLetterCounts",
    "Gathered",
    "StatusView",
    "bootstrap_detail",
    "caught_up",
    "gather",
    "key_ranges",
    "processor_rows",
    "rate_and_eta",
    "view",
    "waiting_strays",
]


@dataclass
class Gathered:
    """What one look at the cluster found."""

    statuses: list[WorkerStatus]
    offsets: dict[tuple[str, int], tuple[int | None, int]]
    """Per input partition: the group's committed offset (None: none yet) and the high watermark."""
    reasons: Counter[str]
    """Dead letters per reason."""
    job: JobLayout | None
    shapes: dict[str, tuple[int, int]]
    """Per input topic: its initial and active partition counts."""
    modes: dict[tuple[str, int], str]
    """Per input partition: its layout mode ("plain" on a topic without a layout)."""
    misplaced: Counter[str]
    """Strays dead-lettered, per "topic/partition" they lay in."""


@dataclass
class DeadLetterCounts:
    """The dead letters by reason (and the misplaced strays by where they lay), read on
    from where the last look ended: a dashboard looks every second, and the topic grows."""

    reasons: Counter[str] = field(default_factory=Counter)
    misplaced: Counter[str] = field(default_factory=Counter)
    """Strays dead-lettered, per "topic/partition" they lay in."""
    _next: dict[int, int] = field(default_factory=dict)

    async def read_more(self, io: KafkaIO, topic: str) -> None:
        for partition in range((await io.partition_count(topic)) or 0):  # no topic: no dead letter yet
            records, self._next[partition] = await io.read(topic, partition, self._next.get(partition, 0))
            for rec in records:
                headers = dict(rec.headers)
                reason = headers.get("streamkit.error.reason", b"?").decode()
                self.reasons[reason] += 1
                if reason == "misplaced":
                    where = (
                        headers.get("streamkit.source.topic", b"?")
                        + b"/"
                        + headers.get("streamkit.source.partition", b"?")
                    )
                    self.misplaced[where.decode()] += 1


async def gather(app: App, bootstrap: Connection, dead: DeadLetterCounts | None = None) -> Gathered:
    """One look at the cluster; ``dead``: the dead letters counted by earlier looks."""
    offsets: dict[tuple[str, int], tuple[int | None, int]] = {}
    dead = DeadLetterCounts() if dead is None else dead
    modes: dict[tuple[str, int], str] = {}
    async with KafkaIO(bootstrap) as io:
        job = await read_job(io, app.name)
        counts = await io.partition_counts(app.input_topics)
        registry = LayoutRegistry(bootstrap, client_id="streamkit-status", io=io)
        await registry.start()
        try:
            await registry.refresh()
            initial = {t: lay.n0 if (lay := registry.get(t)) is not None else n for t, n in counts.items()}
            for t, n in counts.items():
                lay = registry.get(t)
                for p in range(n):
                    modes[(t, p)] = lay.mode(p).label if lay is not None else "plain"
            active = {t: lay.active if (lay := registry.get(t)) is not None else n for t, n in counts.items()}
        finally:
            await registry.stop()
        for topic, n in sorted(counts.items()):
            committed = await io.committed(app.group_id, topic, range(n))
            hws = await io.high_watermarks(topic, range(n))
            for p in range(n):
                offsets[(topic, p)] = (committed.get(p), hws[p])
        try:
            statuses = await read_statuses(io, app.name)
        except TopicNotFoundError:  # no worker ever ran
            statuses = []
        await dead.read_more(io, app.dead_letter_topic)
    shapes = {t: (initial[t], active[t]) for t in counts}
    return Gathered(statuses, offsets, Counter(dead.reasons), job, shapes, modes, Counter(dead.misplaced))


@dataclass
class StatusView:
    """The rows of `status`'s tables (every value a str, int or float: JSON as it is)."""

    app: str
    group: str
    dead_letter_topic: str
    at: float
    workers: list[dict[str, Any]] = field(default_factory=list)
    processors: list[dict[str, Any]] = field(default_factory=list)
    partitions: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: dict[str, int] = field(default_factory=dict)
    job_epoch: int | None = None
    p0: int | None = None
    scaling: str | None = None
    """"2 -> 3" while the job changes its processor count."""
    global_tables: list[dict[str, Any]] = field(default_factory=list)
    """Per running worker and global table: its copy's keys, lag and records left out."""
    standbys: list[dict[str, Any]] = field(default_factory=list)
    """Per standby copy on a running worker: processor, worker, changelog position, lag, state."""
    standbys_short: dict[int, int] = field(default_factory=dict)
    """Per processor with fewer standbys than ``standby_replicas``: how many it has."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def view(app: App, found: Gathered, now: float | None = None) -> StatusView:
    now = time.time() if now is None else now
    job = found.job
    out = StatusView(
        app.name, app.group_id, app.dead_letter_topic, now, dead_letters=dict(sorted(found.reasons.items()))
    )
    if job is not None:
        out.job_epoch, out.p0 = job.epoch, job.p0
        if job.target is not None and job.target != job.p:
            out.scaling = f"{job.p} -> {job.target}"
    owners: dict[tuple[str, int], set[int]] = {}
    ic: Counter[str] = Counter()
    forwarded: Counter[str] = Counter()
    for s in found.statuses:
        forwarded.update(s.strays_forwarded)  # every worker's last word, stopped ones too
        if s.alive and not s.stale:
            ic.update(s.ic_ranges)
            for pid, hosted in s.processors.items():
                for t, p in hosted:
                    owners.setdefault((t, p), set()).add(pid)
    for s in found.statuses:
        out.workers.append(
            {
                "worker": s.worker,
                "state": "stopped" if not s.alive else ("STALE" if s.stale else "running"),
                "processors": sorted(s.processors),
                "handled": s.handled,
                "dead_letters": sum(s.dead_letters.values()),
                "failing_run": s.consecutive_failures,
                "failing": s.consecutive_failures >= app.settings.failure_alarm_after,
                "last_error": (s.last_error or "")[:60],
            }
        )
    out.processors = processor_rows(job, found.statuses, now)
    for s in found.statuses:
        if s.alive and not s.stale:
            for name, g in sorted(s.global_tables.items()):
                out.global_tables.append({"table": name, "worker": s.worker, **g})
            for pid, st in sorted(s.standbys.items()):
                out.standbys.append({"processor": int(pid), "worker": s.worker, **st})
    out.standbys.sort(key=lambda row: (row["processor"], row["worker"]))
    if job is not None and app.settings.standby_replicas:
        kept = Counter(row["processor"] for row in out.standbys)
        out.standbys_short = {pid: kept[pid] for pid in range(job.p) if kept[pid] < app.settings.standby_replicas}
    for (topic, partition), (com, hw) in found.offsets.items():
        where = f"{topic}/{partition}"
        mode = found.modes.get((topic, partition), "?")
        out.partitions.append(
            {
                "topic": topic,
                "partition": partition,
                "mode": mode,
                "processors": sorted(owners.get((topic, partition), ())),
                "keys": key_ranges(job, found.shapes.get(topic), partition),
                "committed": com,
                "ic_ranges": ic[where],
                "high_watermark": hw,
                "lag": hw - (com or 0),
                "strays_forwarded": forwarded[where],
                "strays_waiting": waiting_strays(mode, com, hw),
                "strays_dead": found.misplaced[where],
            }
        )
    return out


def processor_rows(job: JobLayout | None, statuses: list[WorkerStatus], now: float) -> list[dict[str, Any]]:
    """Every processor of the job and its state: active (and where), bootstrapping to join
    or receiving a retiring processor's keys (T2, T1, lag), restoring, retiring; with
    ``hosted`` False when no live worker hosts it."""
    if job is None:
        return []
    rows = []
    live = [s for s in statuses if s.alive and not s.stale]
    step = job.bootstrap
    for pid in range(job.hosted):
        host = next((s for s in live if pid in s.processors or pid in s.joining or pid in s.restoring), None)
        state, detail, progress = "active", "", None
        if step is not None and pid == step.pid:
            lag = host.joining.get(pid, {}) if host is not None else {}
            state = "receiving" if step.staging else "bootstrapping"
            detail = bootstrap_detail(lag, now) if lag else ""
            if lag:
                progress = {"done": lag.get("replayed", 0), "left": lag.get("lag", 0)}
        elif host is not None and (restore := host.restoring.get(pid)):
            state = "restoring"
            detail = f"from the changelog: offset {restore['at']:,} of {restore['end']:,}, " + rate_and_eta(
                restore["at"], restore["end"] - restore["at"], restore["since_ms"], now
            )
            progress = {"done": restore["at"], "left": restore["end"] - restore["at"]}
        elif pid == job.retiring:
            state, detail = "retiring", f"its keys go back to processor {step.pid if step else '?'}"
        elif host is not None and (logged := host.changelog.get(pid)):
            detail = f"changelog at {logged[0]:,}, {logged[1]:,} keys changed since"
        worker = host.worker if host is not None else "-"
        rows.append({"processor": pid, "state": state, "hosted": host is not None, "worker": worker,
                     "detail": detail, "progress": progress})  # fmt: skip
    return rows


def bootstrap_detail(lag: Mapping[str, int], now: float) -> str:
    """Where a bootstrap reads from, how far it got (T2) towards its keys' owner (T1), and
    at what rate."""
    source = "from the changelog, then the input" if lag.get("seeded") else "from the input"
    done = f"{source}: T2 {lag.get('t2', 0):,}, T1 {lag.get('t1', 0):,}, lag {lag.get('lag', 0):,}"
    if "since_ms" not in lag:
        return done
    return f"{done}, " + rate_and_eta(lag.get("replayed", 0), lag.get("lag", 0), lag["since_ms"], now)


def rate_and_eta(done: int, left: int, since_ms: int, now: float) -> str:
    """``done`` records since ``since_ms`` as a rate, and the time ``left`` more take at it."""
    elapsed = max(now - since_ms / 1000, 1e-3)
    rate = done / elapsed
    if left <= 0:
        return f"{rate:,.0f} records/s"
    eta = "-" if rate <= 0 else str(timedelta(seconds=round(left / rate)))
    return f"{rate:,.0f} records/s, ETA {eta}"


def key_ranges(job: JobLayout | None, shape: tuple[int, int] | None, partition: int) -> str:
    """Which processors own which keys of an active partition: "all" (one processor),
    or "shared" and each sharer's hash class (a shared task)."""
    if job is None or shape is None or partition >= shape[1]:
        return ""
    sharers = processors_for_partition(partition, shape[0], shape[1], job.p0, job.p)
    if len(sharers) == 1:
        return "all"
    return "shared: " + ", ".join(
        f"{pid} h%{f.modulus}={min(f.residues)}" for pid, f in sorted(sharers.items()) if f is not None
    )


def waiting_strays(mode: str, committed: int | None, high_watermark: int) -> int:
    """Strays of a partition not forwarded yet: in a partition no layout reads (mode None:
    reserved, or drained and given up), every record beyond the group's position is a
    stray its sweep has still to forward. A number that stays above 0 while the job
    runs is a sweep that does not move. In a partition read in place, the strays not yet
    read are part of its lag."""
    return max(0, high_watermark - (committed or 0)) if mode == "None" else 0


def caught_up(offsets: dict[tuple[str, int], tuple[int | None, int]], shapes: dict[str, tuple[int, int]]) -> bool:
    """Every active partition's committed position has reached its high watermark."""
    return all((com or 0) >= hw for (topic, p), (com, hw) in offsets.items() if p < shapes.get(topic, (0, p + 1))[1])
