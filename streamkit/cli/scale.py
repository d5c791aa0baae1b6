"""`streamkit scale MODULE:APP --processors N`: change a running job's processor count."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from streamkit.cli import CliError
from streamkit.connection import Connection
from streamkit.loader import load_app

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from streamkit.app import App
    from streamkit.kafkaio import KafkaIO
    from streamkit.layout.model import TopicLayout
    from streamkit.runtime.jobmeta import JobLayout
    from streamkit.runtime.status import WorkerStatus


@dataclass(frozen=True)
class Move:
    """One step: p -> p + 1 (processor ``moved`` joins and takes over keys of ``other``, the
    one that splits) or p -> p - 1 (``moved`` retires, its keys go back to ``other``)."""

    moved: int
    other: int
    partitions: dict[str, list[int]]
    """The partitions whose keys move (the moved processor's)."""
    share: float
    """The share of all keys that moves."""
    grow: bool

    def describe(self) -> str:
        parts = "; ".join(f"{t} {ps}" for t, ps in self.partitions.items())
        if self.grow:
            what = f"processor {self.moved}: takes over the keys of processor {self.other}"
        else:
            what = f"processor {self.moved}: retires, its keys go back to processor {self.other}"
        return f"{what} in partitions {parts} (about {self.share:.1%} of all keys)"


def plan_moves(p0: int, p: int, n: int, topics: dict[str, tuple[int, int]]) -> list[Move]:
    """The steps from ``p`` to ``n`` processors (``topics``: {name: (n0, active)})."""
    from assignors.linear_hashing import bucket_modulus, lh_params
    from assignors.placement import partitions_for_processor

    def step(q: int, grow: bool) -> Move:  # processor q joins at count q + 1, or retires from it
        parts = {t: partitions_for_processor(q, n0, active, p0, q + 1) for t, (n0, active) in sorted(topics.items())}
        return Move(q, lh_params(p0, q)[1], parts, 1 / bucket_modulus(q, p0, q + 1), grow)

    if n >= p:
        return [step(q, True) for q in range(p, n)]
    return [step(q, False) for q in range(p - 1, n - 1, -1)]


def scale(
    app_spec: str = typer.Argument(..., metavar="MODULE:APP"),
    processors: int = typer.Option(..., "--processors", "-p", min=1, help="the job's new processor count"),
    broker: str | None = typer.Option(None, "--broker", "-b", help="bootstrap address (default: the app's)"),
    wait: bool = typer.Option(
        True,
        "--wait/--no-wait",
        help="return once the job has settled: every processor of the new count active on a live worker, the "
        "retired ones gone (--no-wait: once the change is published)",
    ),
    timeout: float = typer.Option(
        600.0, "--timeout", metavar="SECONDS", help="exit 1 if the job has not settled by then, saying what has not"
    ),
) -> None:
    """Change a running job's processor count: new processors rebuild their keys' state
    from the input while the running ones go on, then take the keys over.

    Waits until the job has settled at the new count (what `status` then shows); Ctrl-C
    or --timeout stop the waiting, not the change: run the same command again to wait on.
    The count never goes below the job's initial one.
    """
    app = load_app(app_spec)
    bootstrap = app.connection(broker)
    if bootstrap is None:
        raise CliError("the app names no broker: pass --broker or set STREAMKIT_BROKER")
    asyncio.run(_scale(app_spec, app, bootstrap, processors, wait, timeout))


async def _scale(spec: str, app: App, bootstrap: Connection, n: int, wait: bool, timeout: float) -> None:
    from streamkit.kafkaio import KafkaIO
    from streamkit.runtime.jobmeta import read_job

    console = Console()
    async with KafkaIO(bootstrap) as io:
        job = _refuse(spec, app, await read_job(io, app.name), n, waiting=wait)
        if job.target is not None and job.target != job.p:
            console.print(f"job {app.name} is scaling {job.p} -> {n} processors already; waiting for it")
        elif n == job.p:
            console.print(f"job {app.name} has {n} processors already")
        else:
            await _start(io, app, bootstrap, job, n, console.print)
        if wait:
            await _follow(io, app.name, n, timeout, console)


async def start_scale(
    io: KafkaIO, app: App, bootstrap: Connection, n: int, say: Callable[[str], None], spec: str = "MODULE:APP"
) -> None:
    """Start changing ``app``'s job to ``n`` processors, as ``streamkit scale --no-wait``
    does (the autoscaler's lever); ``say`` gets what moves. Raises ``CliError`` with the
    reason when the job cannot take it now."""
    from streamkit.runtime.jobmeta import read_job

    job = _refuse(spec, app, await read_job(io, app.name), n, waiting=False)
    if n != job.p:
        await _start(io, app, bootstrap, job, n, say)


def _refuse(spec: str, app: App, job: JobLayout | None, n: int, *, waiting: bool) -> JobLayout:
    """The job, unless a change to ``n`` processors is refused (``CliError``): it never ran,
    ``n`` is below its initial count, or it is scaling to another count (to the same one,
    only a caller ``waiting`` for it goes on)."""
    if job is None:
        raise CliError(f"job {app.name!r} has never run: start its workers first (streamkit worker {spec})")
    if n < job.p0:
        raise CliError(
            f"cannot scale {app.name} to {n} processors: below its initial count {job.p0} "
            "(keys are placed by linear hashing over it)"
        )
    if job.target is not None and job.target != job.p and (job.target != n or not waiting):
        raise CliError(
            f"job {app.name!r} is already scaling from {job.p} to {job.target} processors; wait for it "
            f"(streamkit scale {spec} --processors {job.target} waits on it)"
        )
    return job


async def _start(
    io: KafkaIO, app: App, bootstrap: Connection, job: JobLayout, n: int, say: Callable[[str], None]
) -> None:
    """Check that the change can be made (changelog room, input history), say what moves,
    and publish it."""
    from streamkit.layout.registry import LayoutRegistry
    from streamkit.runtime.jobmeta import JobLayout, publish_job

    registry = LayoutRegistry(bootstrap, client_id="streamkit-scale", io=io)
    await registry.start()
    try:
        await registry.refresh()
        topics: dict[str, tuple[int, int]] = {}
        shapes = {}
        for topic, physical in (await io.partition_counts(app.input_topics)).items():
            layout = registry.get(topic)
            topics[topic] = (layout.n0, layout.active) if layout is not None else (physical, physical)
            shapes[topic] = (layout, physical)
    finally:
        await registry.stop()
    await _check_changelog_room(io, app, n)
    for move in plan_moves(job.p0, job.p, n, topics):
        say(move.describe())
    for path_taken in await _check_history(io, app, job.p0, job.p, n, shapes, job.incarnation):
        say(path_taken)
    change = JobLayout(
        app.name, job.p0, job.p, job.epoch + 1, n, f"scale-{time.time()}", tuple(app.input_topics), job.incarnation
    )
    started = await publish_job(io, change)
    say(f"job {app.name}: epoch {started.epoch}, scaling {job.p} -> {n} processors")


async def _check_changelog_room(io: KafkaIO, app: App, n: int) -> None:
    """Refuse a growth the job's changelog has no partitions for, on a broker that cannot
    add them (one line saying how to make room)."""
    from streamkit.kafkaio import CREATE_PARTITIONS_API
    from streamkit.state.changelog import changelog_topic, room_message

    if not app.settings.changelog:
        return
    topic = changelog_topic(app.name)
    count = await io.partition_count(topic)
    if count is not None and count < n and not await io.supports_api(CREATE_PARTITIONS_API):
        raise CliError(f"cannot scale {app.name} to {n} processors: {room_message(topic, count, n)}")


async def _check_history(
    io: KafkaIO,
    app: App,
    p0: int,
    p: int,
    n: int,
    shapes: Mapping[str, tuple[TopicLayout | None, int]],
    incarnation: str = "",
) -> list[str]:
    """Refuse a change whose bootstraps would need history that is gone from the input
    topics (above where each bootstrap starts: its source's last changelog marker, or its
    store's positions: 0, or what a backfill wrote on this machine). Returns, per step,
    where its bootstrap reads from and why."""
    from streamkit.errors import HistoryTruncatedError
    from streamkit.runtime.jobmeta import JobLayout
    from streamkit.runtime.key_sets import staging_path, store_positions
    from streamkit.runtime.rebuild import check_history, plan_rebuild

    job = JobLayout(app.name, p0, p, target=n, incarnation=incarnation)
    paths = []
    while (step := job.bootstrap) is not None:
        path = app.store_path(step.pid)
        starts, path_taken = await _bootstrap_start(
            io, app, job, p, store_positions(staging_path(path) if step.staging else path)
        )
        plan = await plan_rebuild(io, step.pid, p0, step.count, shapes, lambda *_: 1 << 62)
        try:
            await check_history(io, plan, starts)
        except HistoryTruncatedError as exc:
            raise CliError(f"cannot scale {app.name} to {n} processors: {exc}") from None
        paths.append(f"processor {step.pid} bootstraps {path_taken}")
        job = job.stepped(by="")
    return paths


async def _bootstrap_start(
    io: KafkaIO, app: App, job: JobLayout, p: int, stored: dict[tuple[str, int], int]
) -> tuple[dict[tuple[str, int], int], str]:
    """Where the bootstrap of ``job``'s next step starts reading the input (``stored``: its
    store's positions), and why."""
    from streamkit.state.changelog import changelog_topic
    from streamkit.state.restore import ChangelogSource, seed_plan

    step = job.bootstrap
    assert step is not None
    if stored:
        return stored, "from its store's positions on (a bootstrap resumed, or a backfill)"
    if not app.settings.changelog:
        return stored, "from the input history: the job has no changelog"
    topic = changelog_topic(app.name)
    if step.staging:
        return await _staging_start(io, topic, job, step.pid, step.count)
    if step.beside >= p:
        return stored, f"from processor {step.beside}'s changelog once that processor has joined"
    changelog = ChangelogSource(io, topic, app.tables, job.p0, job.incarnation)
    plan, why = await seed_plan(changelog, step.beside, step.pid, step.count)
    if plan is None:
        return stored, f"from the input history: {why}"
    return dict(plan.head.checkpoint.positions), (
        f"from processor {step.beside}'s changelog, then the input from its last marker on "
        f"({sum(plan.head.checkpoint.positions.values()):,} input records not read again)"
    )


async def _staging_start(
    io: KafkaIO, topic: str, job: JobLayout, receiving: int, retiring: int
) -> tuple[dict[tuple[str, int], int], str]:
    """Where a shrink's staging store starts reading the input: each changelog head's
    positions for its key set (the lower of the two per partition), or the input history."""
    from streamkit.runtime.scale.staging_seed import holds_keys
    from streamkit.state.restore import head_count, read_plan

    starts: dict[tuple[str, int], int] = {}
    for pid in (receiving, retiring):
        plan, _ = await read_plan(io, topic, pid, incarnation=job.incarnation)
        if plan is None or not holds_keys(pid, job.p0, head_count(plan, job.p0), retiring + 1):
            return {}, (
                f"from the input history: processor {pid} has no chain of markers for {retiring + 1} processors "
                f"in {topic}; the receiving processor {receiving} rebuilds its whole key set for {retiring} "
                "processors beside its live store"
            )
        for tp, at in plan.head.checkpoint.positions.items():
            starts[tp] = min(starts.get(tp, at), at)
    return starts, (
        f"from the changelogs of processors {receiving} and {retiring}, then the input from their last markers on "
        f"({sum(starts.values()):,} input records not read again)"
    )


async def _follow(io: KafkaIO, app_name: str, n: int, timeout: float, console: Console) -> None:
    """Show each bootstrap (a joining processor's, or a shrink's receiving one's), then the
    group placing the processors, until the job has settled at ``n`` processors
    (``status_view.unsettled``: what `status` says); one line saying what has not, at
    ``timeout``."""
    from streamkit.cli.status_view import Heartbeats, unsettled
    from streamkit.runtime.jobmeta import read_job

    beats = Heartbeats(app_name)  # read on from look to look
    deadline = time.monotonic() + timeout
    job = await read_job(io, app_name)
    assert job is not None
    if job.p == n and not unsettled(job, await beats.read_more(io)):  # nothing to follow
        console.print(f"job {app_name}: {n} processors, each active on a live worker (epoch {job.epoch})")
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    progress = Progress(*columns, console=console, transient=False)  # started with its first bar
    tasks: dict[int, TaskID] = {}  # per job epoch of a step: the step's bootstrap
    settling: TaskID | None = None
    try:
        while True:
            job = await read_job(io, app_name)
            assert job is not None
            _same_change(app_name, job, n)
            statuses = await beats.read_more(io)
            _show_bootstraps(progress, tasks, job, statuses)
            reasons = unsettled(job, statuses)
            if job.p == n and not reasons:
                break
            if job.p == n:  # the last step is done: the group places the processors on workers
                if settling is None:
                    progress.start()
                    settling = progress.add_task("every processor on a live worker", total=None, detail="")
                progress.update(settling, detail=reasons[0])
            if time.monotonic() > deadline:
                more = f"; and {len(reasons) - 3} more" if len(reasons) > 3 else ""
                raise CliError(f"job {app_name} has not settled after {timeout:g} s: {'; '.join(reasons[:3])}{more}")
            await asyncio.sleep(0.5)  # the workers beat every 2 s, and at each change
        if settling is not None:
            progress.update(settling, completed=1, total=1, detail="settled")
    finally:
        progress.stop()
    console.print(f"job {app_name}: {n} processors, each active on a live worker (epoch {job.epoch})")


def _same_change(app_name: str, job: JobLayout, n: int) -> None:
    """Refuse to wait on: another change made the job aim at another count."""
    aim = job.target if job.target is not None else job.p
    if aim != n:
        raise CliError(f"job {app_name} now aims at {aim} processors, not {n}: another `streamkit scale` changed it")


def _show_bootstraps(
    progress: Progress, tasks: dict[int, TaskID], job: JobLayout, statuses: list[WorkerStatus]
) -> None:
    """A bar per step's bootstrap (per job epoch), from its host's heartbeat."""
    step = job.bootstrap
    for s in statuses:
        lag = s.joining.get(step.pid) if step is not None else None
        if step is None or lag is None or not s.alive or s.stale:
            continue
        task = tasks.get(job.epoch)
        if task is None:
            what = "joins" if not step.staging else f"receives processor {job.p - 1}'s keys"
            progress.start()
            task = tasks[job.epoch] = progress.add_task(f"processor {step.pid} {what}", total=None, detail="")
        done, total = lag.get("t2", 0), lag.get("t1", 0)
        detail = f"replayed {lag.get('replayed', 0):,}, {lag.get('lag', 0):,} behind the owner"
        progress.update(task, completed=done, total=max(total, 1), detail=detail)
    for epoch, task in tasks.items():
        if epoch < job.epoch:
            progress.update(task, completed=1, total=1, detail="handed over")


def register(cli: typer.Typer) -> None:
    cli.command("scale")(scale)
