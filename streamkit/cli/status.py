"""`streamkit status MODULE:APP`: workers, processors, partitions, lag, dead letters."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Mapping
from datetime import timedelta

import typer
from rich.console import Console
from rich.table import Table

from assignors.placement import processors_for_partition
from streamkit.app import App
from streamkit.cli import CliError
from streamkit.connection import Connection
from streamkit.errors import TopicNotFoundError
from streamkit.kafkaio import KafkaIO
from streamkit.layout.registry import LayoutRegistry
from streamkit.loader import load_app
from streamkit.runtime.jobmeta import JobLayout, read_job
from streamkit.runtime.status import WorkerStatus, read_statuses

Gathered = tuple[
    list[WorkerStatus],
    dict[tuple[str, int], tuple[int | None, int]],
    Counter[str],
    JobLayout | None,
    dict[str, tuple[int, int]],
    dict[tuple[str, int], str],
    Counter[str],
]


async def _gather(app: App, bootstrap: Connection) -> Gathered:
    offsets: dict[tuple[str, int], tuple[int | None, int]] = {}
    reasons: Counter[str] = Counter()
    misplaced: Counter[str] = Counter()
    """Strays dead-lettered, per "topic/partition" they lay in."""
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
        try:
            for rec in await io.read_topic(app.dead_letter_topic):
                headers = dict(rec.headers)
                reason = headers.get("streamkit.error.reason", b"?").decode()
                reasons[reason] += 1
                if reason == "misplaced":
                    where = (
                        headers.get("streamkit.source.topic", b"?")
                        + b"/"
                        + headers.get("streamkit.source.partition", b"?")
                    )
                    misplaced[where.decode()] += 1
        except TopicNotFoundError:  # no dead letter yet
            pass
    return statuses, offsets, reasons, job, {t: (initial[t], active[t]) for t in counts}, modes, misplaced


def processors_table(job: JobLayout | None, statuses: list[WorkerStatus]) -> Table:
    """Every processor of the job and its state: active (and where), bootstrapping to join
    or receiving a retiring processor's keys (T2, T1, lag), retiring, or not hosted by a
    live worker."""
    table = Table(title="processors" + (f" (job epoch {job.epoch}, p0 {job.p0})" if job else ""))
    for col in ("processor", "state", "worker", "detail"):
        table.add_column(col)
    if job is None:
        return table
    live = [s for s in statuses if s.alive and not s.stale]
    step = job.bootstrap
    for pid in range(job.hosted):
        host = next((s for s in live if pid in s.processors or pid in s.joining or pid in s.restoring), None)
        state, detail = "active", ""
        if step is not None and pid == step.pid:
            lag = host.joining.get(pid, {}) if host is not None else {}
            state = "receiving" if step.staging else "bootstrapping"
            detail = bootstrap_detail(lag, time.time()) if lag else ""
        elif host is not None and (restore := host.restoring.get(pid)):
            state = "restoring"
            detail = f"from the changelog: offset {restore['at']:,} of {restore['end']:,}, " + rate_and_eta(
                restore["at"], restore["end"] - restore["at"], restore["since_ms"], time.time()
            )
        elif pid == job.retiring:
            state, detail = "retiring", f"its keys go back to processor {step.pid if step else '?'}"
        elif host is not None and (logged := host.changelog.get(pid)):
            detail = f"changelog at {logged[0]:,}, {logged[1]:,} keys changed since"
        table.add_row(str(pid), state if host is not None else f"{state} (no live worker)",
                      host.worker if host is not None else "-", detail)  # fmt: skip
    if job.target is not None and job.target != job.p:
        table.caption = f"scaling {job.p} -> {job.target} processors"
    return table


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


def stray_counts(forwarded: int, dead: int, waiting: int = 0) -> str:
    """A partition's strays: forwarded by the workers (as they last reported),
    dead-lettered, and waiting to be forwarded (see :func:`waiting_strays`)."""
    parts = [f"{forwarded} forwarded"] if forwarded else []
    if waiting:
        parts.append(f"[bold yellow]{waiting} waiting[/]")
    if dead:
        parts.append(f"{dead} misplaced (dead letters)")
    return ", ".join(parts) or "-"


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


def status(
    app_spec: str = typer.Argument(..., metavar="MODULE:APP"),
    broker: str | None = typer.Option(None, "--broker", "-b", help="bootstrap address (default: the app's)"),
    wait: float | None = typer.Option(
        None,
        "--wait-caught-up",
        metavar="SECONDS",
        help="first wait until every active partition is committed up to its high watermark (exit 1 after SECONDS)",
    ),
) -> None:
    """Show the job: workers and their processors, per-partition progress and lag, dead letters."""
    console = Console(width=None if Console().is_terminal else 200)
    app = load_app(app_spec)
    bootstrap = app.connection(broker)
    if bootstrap is None:
        raise CliError("the app names no broker: pass --broker or set STREAMKIT_BROKER")
    statuses, offsets, reasons, job, shapes, modes, misplaced = asyncio.run(_gather(app, bootstrap))
    deadline = time.monotonic() + (wait or 0)
    while wait is not None and not caught_up(offsets, shapes):
        if time.monotonic() > deadline:
            lag = sum(max(0, hw - (com or 0)) for com, hw in offsets.values())
            raise CliError(f"app {app.name} has not caught up after {wait:g} s (lag {lag:,} records)")
        time.sleep(0.5)
        statuses, offsets, reasons, job, shapes, modes, misplaced = asyncio.run(_gather(app, bootstrap))

    owners: dict[tuple[str, int], set[int]] = {}
    ic: Counter[str] = Counter()
    forwarded: Counter[str] = Counter()
    for s in statuses:
        forwarded.update(s.strays_forwarded)  # every worker's last word, stopped ones too
        if s.alive and not s.stale:
            ic.update(s.ic_ranges)
            for pid, hosted in s.processors.items():
                for t, p in hosted:
                    owners.setdefault((t, p), set()).add(pid)
    workers = Table(title=f"app {app.name}: workers")
    for col in ("worker", "state", "processors", "handled", "dead letters", "failing run", "last error"):
        workers.add_column(col)
    for s in statuses:
        state = "stopped" if not s.alive else ("STALE" if s.stale else "running")
        fail = str(s.consecutive_failures)
        if s.consecutive_failures >= app.settings.failure_alarm_after:
            fail = f"[bold red]{fail} FAILING[/]"
        workers.add_row(
            s.worker,
            state,
            ", ".join(str(p) for p in sorted(s.processors)) or "-",
            str(s.handled),
            str(sum(s.dead_letters.values())),
            fail,
            (s.last_error or "")[:60],
        )
    parts = Table(title=f"partitions (consumer group {app.group_id})")
    cols = (
        "topic",
        "partition",
        "mode",
        "processor",
        "keys",
        "committed",
        "IC ranges",
        "high watermark",
        "lag",
        "strays",
    )
    for col in cols:
        parts.add_column(
            col, justify="left" if col in ("topic", "mode", "keys", "strays") else "right", no_wrap=col == "keys"
        )
    for (topic, partition), (com, hw) in offsets.items():
        lag = hw - (com or 0)
        parts.add_row(
            topic,
            str(partition),
            modes.get((topic, partition), "?"),
            ", ".join(map(str, sorted(owners.get((topic, partition), ())))) or "-",
            key_ranges(job, shapes.get(topic), partition),
            "-" if com is None else str(com),
            str(ic[f"{topic}/{partition}"]),
            str(hw),
            str(lag),
            stray_counts(
                forwarded[f"{topic}/{partition}"],
                misplaced[f"{topic}/{partition}"],
                waiting_strays(modes.get((topic, partition), "?"), com, hw),
            ),
        )
    console.print(workers)
    console.print(processors_table(job, statuses))
    console.print(parts)
    console.print(dead_letters_table(reasons, app.dead_letter_topic))
    console.print(f"as of {time.strftime('%H:%M:%S')}")


def dead_letters_table(reasons: Mapping[str, int], topic: str) -> Table:
    """The dead letters by reason, captioned with their topic: the table is at least as
    wide as the caption, so that a narrow terminal does not break the topic's name."""
    caption = f"topic {topic}"
    dl = Table(title="dead letters", caption=caption, min_width=len(caption) + 2)
    dl.add_column("reason")
    dl.add_column("records", justify="right")
    for reason, n in sorted(reasons.items()):
        dl.add_row(reason, str(n))
    if not reasons:
        dl.add_row("-", "0")
    return dl


def register(cli: typer.Typer) -> None:
    cli.command("status")(status)
