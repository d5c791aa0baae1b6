"""`streamkit autoscale MODULE:APP --min N --max M`: scale a job's workers and processors
with its load (``streamkit.autoscale``)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from streamkit.loader import load_app

if TYPE_CHECKING:
    from streamkit.app import App
    from streamkit.autoscale.controller import WorkerLever
    from streamkit.autoscale.policy import Policy
    from streamkit.connection import Connection

JOB_WAIT = 60.0
"""Seconds the first local workers have to start a job that never ran."""

WORKERS_HELP = (
    "where workers come from: local (worker processes started and stopped on this machine, one that dies "
    "restarted), gauge (the count wanted published as streamkit_autoscale_desired_workers on --metrics-port, "
    "for a HorizontalPodAutoscaler or KEDA)"
)


@dataclass(frozen=True)
class AutoscaleOptions:
    """The command's options, handed on as one."""

    app_spec: str
    min_workers: int
    max_workers: int
    workers: str
    target_utilization: float
    catch_up: float
    stabilization: float
    retry_after: float
    interval: float
    dry_run: bool
    record: Path | None
    broker: str | None
    metrics_port: int | None
    worker_args: tuple[str, ...]
    logs: Path | None
    replay: Path | None = None
    window: float = 10.0
    metrics_bind: str = "127.0.0.1"


def autoscale(
    app_spec: str = typer.Argument(..., metavar="MODULE:APP"),
    min_workers: int = typer.Option(1, "--min", min=1, help="workers at least"),
    max_workers: int = typer.Option(..., "--max", min=1, help="workers at most"),
    workers: str = typer.Option("local", "--workers", help=WORKERS_HELP),
    target_utilization: float = typer.Option(0.7, "--target-utilization", min=0.05, max=1.0),
    catch_up: float = typer.Option(60.0, "--catch-up", metavar="SECONDS", help="drain a backlog within this"),
    stabilization: float = typer.Option(
        60.0, "--stabilization", metavar="SECONDS", help="seconds of lower load before a scale-in"
    ),
    retry_after: float = typer.Option(30.0, "--retry-after", metavar="SECONDS", help="after a refused scale"),
    interval: float = typer.Option(5.0, "--interval", metavar="SECONDS", help="seconds between looks at the job"),
    window: float = typer.Option(
        10.0, "--window", metavar="SECONDS", help="rates over at least this many seconds (heartbeats come every 2 s)"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="only print what it would do and why"),
    record: Path | None = typer.Option(None, "--record", help="append each look's figures to this file (JSON lines)"),
    broker: str | None = typer.Option(None, "--broker", "-b", help="bootstrap address (default: the app's)"),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", min=1, max=65535, help="serve the autoscaler's gauges on this port"
    ),
    metrics_bind: str = typer.Option(
        "127.0.0.1", "--metrics-bind", help="the address the gauges are served at (0.0.0.0: every interface)"
    ),
    worker_arg: list[str] = typer.Option([], "--worker-arg", help="an argument for each local worker (repeat)"),
    logs: Path | None = typer.Option(None, "--logs", help="a directory for the local workers' output"),
    replay: Path | None = typer.Option(
        None, "--replay", help="print the decisions these options make on a history --record wrote, and exit"
    ),
) -> None:
    """Watch a job and scale it: out as soon as its load or backlog needs more workers,
    in after --stabilization seconds of lower load, one worker at a time; never while a
    scale or a rebalance is under way, never below the job's initial processor count.
    Each decision is printed with the figures it used."""
    from streamkit.autoscale.policy import Limits
    from streamkit.cli import CliError

    if workers not in ("local", "gauge"):
        raise CliError(f"--workers {workers!r}: local or gauge")
    if min_workers > max_workers:
        raise CliError(f"--min {min_workers} is above --max {max_workers}")
    for option, seconds in (("--interval", interval), ("--window", window)):
        if not (math.isfinite(seconds) and seconds > 0):
            raise CliError(f"{option} {seconds}: need a number of seconds > 0")
    try:  # (before a worker is started)
        Limits(min_workers, max_workers, 1, target_utilization, catch_up, stabilization, retry_after)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if workers == "gauge" and metrics_port is None and not dry_run:
        raise CliError("--workers gauge publishes the count it wants on --metrics-port: give one")
    opts = AutoscaleOptions(
        app_spec, min_workers, max_workers, workers, target_utilization, catch_up, stabilization, retry_after,
        interval, dry_run, record, broker, metrics_port, tuple(worker_arg), logs, replay, window, metrics_bind,
    )  # fmt: skip
    if replay is not None:
        _replay(opts, replay)
        return
    asyncio.run(run_autoscale(opts))


def _replay(opts: AutoscaleOptions, history: Path) -> None:
    from streamkit.autoscale.policy import Limits
    from streamkit.autoscale.signals import replay
    from streamkit.cli import CliError

    if not history.is_file():
        raise CliError(f"--replay {history}: no such file")
    limits = Limits(opts.min_workers, opts.max_workers, 1, opts.target_utilization, opts.catch_up, opts.stabilization,
                    opts.retry_after)  # fmt: skip
    decisions = replay(history.read_text().splitlines(), limits)
    start = decisions[0].at if decisions else 0.0
    for d in decisions:
        print(f"+{d.at - start:7.1f} s  {d.line()}")


async def run_autoscale(opts: AutoscaleOptions) -> None:
    """Until SIGTERM/SIGINT: the controller's loop (local workers are stopped on the way out)."""
    from streamkit.autoscale.controller import Gauge
    from streamkit.autoscale.local_workers import LocalWorkers
    from streamkit.autoscale.policy import Limits, Policy
    from streamkit.cli import CliError

    app = load_app(opts.app_spec)
    bootstrap = app.connection(opts.broker)
    if bootstrap is None:
        raise CliError("the app names no broker: pass --broker or set STREAMKIT_BROKER")
    lever: WorkerLever
    if opts.workers == "local":
        from streamkit.cli import root_options

        args = [*opts.worker_args, *(["--broker", opts.broker] if opts.broker else [])]
        lever = LocalWorkers(opts.app_spec, args, logs=opts.logs, root=root_options())
    else:
        lever = Gauge()
    try:
        p0 = await _initial_processors(app, bootstrap, lever if not opts.dry_run else None, opts)
        limits = Limits(opts.min_workers, opts.max_workers, p0, opts.target_utilization, opts.catch_up,
                        opts.stabilization, opts.retry_after)  # fmt: skip
        await _control(app, bootstrap, opts, lever, Policy(limits), p0)
    finally:
        if isinstance(lever, LocalWorkers):
            with contextlib.suppress(Exception):
                await asyncio.to_thread(lever.stop_all)


async def _initial_processors(app: App, bootstrap: Connection, lever: object, opts: AutoscaleOptions) -> int:
    """The job's initial processor count; with local workers, a job that never ran is
    started first (``--min`` workers) and waited for."""
    from streamkit.autoscale.local_workers import LocalWorkers
    from streamkit.cli import CliError
    from streamkit.kafkaio import KafkaIO
    from streamkit.runtime.jobmeta import read_job

    if isinstance(lever, LocalWorkers):
        lever.scale_to(opts.min_workers)
    deadline = time.monotonic() + JOB_WAIT
    async with KafkaIO(bootstrap) as io:
        while (job := await read_job(io, app.name)) is None:
            if isinstance(lever, LocalWorkers) and lever.count == 0:
                raise CliError(f"the workers of {app.name} exited before the job started: see their output")
            if not isinstance(lever, LocalWorkers) or time.monotonic() > deadline:
                raise CliError(
                    f"job {app.name!r} has never run: start its workers first (streamkit worker {opts.app_spec})"
                )
            await asyncio.sleep(0.2)
    return job.p0


async def _control(
    app: App, bootstrap: Connection, opts: AutoscaleOptions, lever: WorkerLever, policy: Policy, p0: int
) -> None:
    from streamkit.autoscale.controller import Controller, Gauge
    from streamkit.autoscale.gauges import serve_gauges
    from streamkit.autoscale.journal import JournalReader, JournalWriter, controller_info
    from streamkit.cli.scale import start_scale
    from streamkit.kafkaio import KafkaIO

    async def request_scale(n: int) -> None:
        async with KafkaIO(bootstrap) as scaling:
            await start_scale(scaling, app, bootstrap, n, say=print, spec=opts.app_spec)

    limits = {"min": opts.min_workers, "max": opts.max_workers, "target_utilization": opts.target_utilization}
    about = controller_info(opts.workers, opts.dry_run, limits, opts.interval)
    journal = JournalWriter(bootstrap)
    controller = Controller(
        app, bootstrap, policy, lever, request_scale, opts.dry_run, opts.record, opts.interval, opts.window,
        journal=journal, about=about,
    )  # fmt: skip
    async with KafkaIO(bootstrap) as io:  # a restart goes on from what it decided last
        if (resumed := controller.resume(await JournalReader(app.name).read_more(io))) is not None:
            print(resumed, flush=True)
    stop_serving = None
    if opts.metrics_port is not None:
        last = lambda: controller.decisions[-1] if controller.decisions else None  # noqa: E731
        desired = lambda: lever.desired if isinstance(lever, Gauge) else lever.count  # noqa: E731
        stop_serving = serve_gauges(app.name, last, desired, opts.metrics_port, opts.metrics_bind)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"autoscaling {app.name}: {opts.min_workers}..{opts.max_workers} workers ({opts.workers}), "
          f"at least {p0} processors{' (dry run)' if opts.dry_run else ''}", flush=True)  # fmt: skip
    try:
        await controller.run(stop)
    finally:
        await journal.close()
        if stop_serving is not None:
            stop_serving()


def register(app: typer.Typer) -> None:
    app.command("autoscale")(autoscale)
