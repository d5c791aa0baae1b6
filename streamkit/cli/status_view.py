"""What `status` and the dashboard show of a job, as plain data: gathered from the
cluster (the job record, layouts, committed offsets and high watermarks, the workers'
heartbeats, the dead letters), then turned into rows (``view``). `status` draws the rows
as tables or prints them as JSON (``--json``); the dashboard serves the same JSON; `scale
--wait` waits on ``unsettled``."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from assignors.placement import processors_for_partition
from streamkit.app import App
from streamkit.autoscale.journal import Entry, JournalReader, autoscale_view
from streamkit.connection import Connection
from streamkit.kafkaio import KafkaIO
from streamkit.layout.model import TopicLayout
from streamkit.layout.registry import LayoutRegistry
from streamkit.runtime.jobmeta import JobLayout, read_job
from streamkit.runtime.status import SKIPPED_KINDS, STATUS_TOPIC, WorkerStatus, decode_status

__all__ = [
    "DeadLetterCounts",
    "Gathered",
    "Heartbeats",
    "StatusView",
    "bootstrap_detail",
    "caught_up",
    "gather",
    "key_ranges",
    "processor_rows",
    "rate_and_eta",
    "skipped",
    "unsettled",
    "view",
    "waiting_strays",
]

LAST_ERROR_CHARS = 200
"""A worker's last error is shown up to this many characters (its first line)."""


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
    ever_active: dict[str, int] = field(default_factory=dict)
    """Per input topic with a layout: the highest active partition count it ever had (a
    partition below it that nobody reads now is a drained one, above it a reserved one)."""
    journal: list[Entry] = field(default_factory=list)
    """The autoscaler's records of the last minutes (read only when asked: ``gather``)."""


@dataclass
class Heartbeats:
    """The newest heartbeat of each worker of ``app``, read on from where the last look
    ended (the status topic holds every app's heartbeats since long ago)."""

    app: str
    latest: dict[str, WorkerStatus] = field(default_factory=dict)
    _next: dict[int, int] = field(default_factory=dict)

    async def read_more(self, io: KafkaIO) -> list[WorkerStatus]:
        """Every worker's newest heartbeat (none: no worker ever ran), by worker name."""
        for partition in range((await io.partition_count(STATUS_TOPIC)) or 0):
            records, self._next[partition] = await io.read(STATUS_TOPIC, partition, self._next.get(partition, 0))
            for rec in records:
                if (status := decode_status(rec.value, self.app, rec=rec)) is not None:
                    self.latest[status.worker] = status
        return sorted(self.latest.values(), key=lambda s: s.worker)


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


async def gather(
    app: App,
    bootstrap: Connection,
    dead: DeadLetterCounts | None = None,
    beats: Heartbeats | None = None,
    journal: JournalReader | None = None,
) -> Gathered:
    """One look at the cluster; ``dead``, ``beats``, ``journal``: the dead letters,
    heartbeats and autoscaler records read by earlier looks (read on from there; no
    ``journal``: the autoscaler's records are not read)."""
    offsets: dict[tuple[str, int], tuple[int | None, int]] = {}
    dead = DeadLetterCounts() if dead is None else dead
    beats = Heartbeats(app.name) if beats is None else beats
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
            ever = {t: _ever_active(lay) for t in counts if (lay := registry.get(t)) is not None}
        finally:
            await registry.stop()
        for topic, n in sorted(counts.items()):
            committed = await io.committed(app.group_id, topic, range(n))
            hws = await io.high_watermarks(topic, range(n))
            for p in range(n):
                offsets[(topic, p)] = (committed.get(p), hws[p])
        statuses = await beats.read_more(io)
        await dead.read_more(io, app.dead_letter_topic)
        decided = await journal.read_more(io) if journal is not None else []
    shapes = {t: (initial[t], active[t]) for t in counts}
    return Gathered(
        statuses, offsets, Counter(dead.reasons), job, shapes, modes, Counter(dead.misplaced), ever, decided
    )


def _ever_active(layout: TopicLayout) -> int:
    """The highest active partition count of the layout's history (partitions activate and
    drain from the top: every partition below it was read and written once)."""
    return max([layout.n0, layout.active, *(max(s.old_active, s.new_active) for s in layout.seals)])


@dataclass
class StatusView:
    """The job as `status` shows it: the document `status --json` prints and the dashboard
    serves at ``/api/status`` (``as_dict()``). Its top-level keys, stable (new ones may be
    added; none is renamed or dropped):

    - ``app``, ``group``, ``dead_letter_topic``: the app's name, consumer group, dead-letter topic.
    - ``at``: when the look was taken (Unix time, seconds).
    - ``job_epoch``, ``p0``, ``processor_count``, ``target``: the job record: its epoch (one
      more at every change of the record), initial processor count (keys are placed over it; the
      floor of `scale`), active processor count, and the count a scale change aims at
      (null: none under way; all four null: the job never ran).
    - ``scaling``: ``"2 -> 3"`` while the processor count changes, else null.
    - ``unsettled``: what keeps the job from being settled, in words (``unsettled``); an
      empty list: every processor active on exactly one live worker, none retired left.
    - ``workers``: per worker that ever beat: ``worker``, ``state`` (running, stopped, STALE:
      no heartbeat for 15 s), ``processors``, ``handled``, ``dead_letters``, ``failing_run``
      (records failed in a row), ``failing`` (at the app's failure_alarm_after), ``last_error``.
    - ``processors``: per processor (``processor_rows``): ``processor``, ``state`` (active,
      bootstrapping, receiving, restoring, retiring), ``hosted`` (a live worker has it),
      ``worker``, ``detail``, ``progress`` (``{"done", "left"}`` or null).
    - ``partitions``: per input partition, drained and reserved ones too: ``topic``,
      ``partition``, ``mode`` (ReadWrite, ReadOnly, None, plain), ``state`` (active,
      draining, drained, reserved), ``processors``, ``keys``, ``committed`` (null: none
      yet), ``ic_ranges``, ``high_watermark``, ``lag``, ``strays_forwarded``,
      ``strays_waiting``, ``strays_dead``.
    - ``dead_letters``: records per reason.
    - ``global_tables``, ``standbys``: per running worker's copy; ``standbys_short``: per
      processor (a string key) with fewer standbys than asked for, how many it has.
    - ``skipped``: records the workers skipped on purpose since they started (``skipped``),
      from every worker's last heartbeat: ``malformed`` (records of an internal topic that
      did not decode, per topic: the most any worker skipped, as every worker reads the same
      records), ``copies`` (copies for compaction) and ``duplicate_strays`` (second copies of
      forwarded strays), both per "topic/partition", summed over the workers; and what
      records missed: ``missed_windows`` (closed windows late records did not join, per
      windowed table) and ``failed_unmatched`` (failed join calls for records that met
      nobody, per join), summed over the workers.
    - ``autoscale``: the autoscaler's view (``streamkit.autoscale.journal.autoscale_view``:
      ``controller``, ``running``, ``at``, ``inputs``, ``decision``, ``decisions``,
      ``history``), null when none decided in the last 10 minutes.
    """

    app: str
    group: str
    dead_letter_topic: str
    at: float
    job_epoch: int | None = None
    p0: int | None = None
    processor_count: int | None = None
    target: int | None = None
    scaling: str | None = None
    """"2 -> 3" while the job changes its processor count."""
    unsettled: list[str] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    processors: list[dict[str, Any]] = field(default_factory=list)
    partitions: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: dict[str, int] = field(default_factory=dict)
    global_tables: list[dict[str, Any]] = field(default_factory=list)
    """Per running worker and global table: its copy's keys, lag and records left out."""
    standbys: list[dict[str, Any]] = field(default_factory=list)
    """Per standby copy on a running worker: processor, worker, changelog position, lag, state."""
    standbys_short: dict[int, int] = field(default_factory=dict)
    """Per processor with fewer standbys than ``standby_replicas``: how many it has."""
    skipped: dict[str, dict[str, int]] = field(default_factory=lambda: {kind: {} for kind in SKIPPED_KINDS})
    """Records skipped on purpose, per kind (``SKIPPED_KINDS``)."""
    autoscale: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The document, JSON as it is (the keys of ``standbys_short`` as strings)."""
        out = asdict(self)
        out["standbys_short"] = {str(pid): n for pid, n in self.standbys_short.items()}
        return out


def view(app: App, found: Gathered, now: float | None = None) -> StatusView:
    now = time.time() if now is None else now
    job = found.job
    out = StatusView(
        app.name, app.group_id, app.dead_letter_topic, now, dead_letters=dict(sorted(found.reasons.items()))
    )
    if job is not None:
        out.job_epoch, out.p0, out.processor_count = job.epoch, job.p0, job.p
        if job.target is not None and job.target != job.p:
            out.scaling, out.target = f"{job.p} -> {job.target}", job.target
    out.unsettled = unsettled(job, found.statuses)
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
                "last_error": (s.last_error or "").strip().split("\n")[0][:LAST_ERROR_CHARS],
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
    out.partitions = partition_rows(found)
    out.skipped = skipped(found.statuses)
    out.autoscale = autoscale_view(found.journal, now)
    return out


def skipped(statuses: list[WorkerStatus]) -> dict[str, dict[str, int]]:
    """What the workers skipped on purpose, from each one's last heartbeat (stopped ones
    too): malformed records per internal topic, the most any worker skipped (each worker
    reads the same records); copies and duplicate strays per "topic/partition", summed."""
    out: dict[str, dict[str, int]] = {kind: {} for kind in SKIPPED_KINDS}
    for s in statuses:
        for kind, counts in s.skipped.items():
            if kind not in out:
                continue  # a kind a newer worker counts: not shown by this version
            into = out[kind]
            for where, n in counts.items():
                into[where] = max(into.get(where, 0), n) if kind == "malformed" else into.get(where, 0) + n
    return {kind: dict(sorted(counts.items())) for kind, counts in out.items()}


def partition_rows(found: Gathered) -> list[dict[str, Any]]:
    """Every input partition: its mode and state, the processors the live workers host it
    in, its keys' owners, committed offset, high watermark, lag, IC ranges and strays."""
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
    rows = []
    for (topic, partition), (com, hw) in found.offsets.items():
        where = f"{topic}/{partition}"
        mode = found.modes.get((topic, partition), "?")
        ever = found.ever_active.get(topic, found.shapes.get(topic, (0, 0))[1])
        rows.append(
            {
                "topic": topic,
                "partition": partition,
                "mode": mode,
                "state": PARTITION_STATES.get(mode, "drained" if partition < ever else "reserved"),
                "processors": sorted(owners.get((topic, partition), ())),
                "keys": key_ranges(found.job, found.shapes.get(topic), partition),
                "committed": com,
                "ic_ranges": ic[where],
                "high_watermark": hw,
                "lag": hw - (com or 0),
                "strays_forwarded": forwarded[where],
                "strays_waiting": waiting_strays(mode, com, hw),
                "strays_dead": found.misplaced[where],
            }
        )
    return rows


PARTITION_STATES = {"ReadWrite": "active", "plain": "active", "ReadOnly": "draining"}
"""A partition's state by its mode; one of mode None is drained (read once) or reserved."""


def unsettled(job: JobLayout | None, statuses: list[WorkerStatus]) -> list[str]:
    """What keeps the job from being settled, in words (empty: settled): a scale step under
    way, a processor no live worker hosts, one still bootstrapping or restoring, one two
    live workers claim (moving), one beyond the processor count still hosted (retired)."""
    if job is None:
        return ["the job has never run"]
    out = []
    step = job.bootstrap
    live = [s for s in statuses if s.alive and not s.stale]
    if step is not None:
        doing = "receives the retiring processor's keys" if step.staging else "bootstraps"
        lags = [f", {lag['lag']:,} records behind" for s in live if "lag" in (lag := s.joining.get(step.pid, {}))]
        how = lags[0] if lags else ", on no live worker yet"
        out.append(f"scaling {job.p} -> {job.target} processors (processor {step.pid} {doing}{how})")
    for pid in range(job.hosted):
        if step is not None and pid == step.pid:
            continue
        busy = [f"bootstrapping on {s.worker}" for s in live if pid in s.joining]
        busy += [f"restoring on {s.worker}" for s in live if pid in s.restoring]
        hosts = [s.worker for s in live if pid in s.processors]
        if busy:
            out.append(f"processor {pid} is {busy[0]}")
        elif not hosts:
            out.append(f"processor {pid} has no live worker")
        elif len(hosts) > 1:
            out.append(f"processor {pid} is claimed by {len(hosts)} workers ({', '.join(hosts)}): moving")
    for s in live:
        for pid in sorted({*s.processors, *s.joining, *s.restoring} - set(range(job.hosted))):
            out.append(f"retired processor {pid} is still on {s.worker}")
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
