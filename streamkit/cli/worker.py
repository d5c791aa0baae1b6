"""`streamkit worker MODULE:APP`: run processors of an app in this process."""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys

import typer

from streamkit.app import App
from streamkit.loader import load_app
from streamkit.ops.exposure import serving_problem
from streamkit.settings import given_on_command_line


def worker(
    app_spec: str = typer.Argument(..., metavar="MODULE:APP", help="the App to run, e.g. examples.orders:app"),
    members: int = typer.Option(
        1, "--members", "-m", min=1, help="consumer group members in this process (each hosts some processors)"
    ),
    renamed: int | None = typer.Option(None, "--processors", "-k", hidden=True),
    broker: str | None = typer.Option(
        None, "--broker", "-b", help="bootstrap address (else the app's broker or STREAMKIT_BROKER)"
    ),
    embedded: bool = typer.Option(False, "--embedded-broker", help="start an embedded broker for this worker"),
    log_level: str = typer.Option("INFO", "--log-level"),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", min=1, max=65535, help="serve Prometheus metrics on this port (STREAMKIT_METRICS_PORT)"
    ),
    query_port: int | None = typer.Option(
        None,
        "--query-port",
        min=1,
        max=65535,
        help="answer queries of state by key on this port (STREAMKIT_QUERY_PORT)",
    ),
    metrics_bind: str | None = typer.Option(
        None,
        "--metrics-bind",
        help="the address metrics are served at (STREAMKIT_METRICS_BIND; default 127.0.0.1: this machine only; "
        "0.0.0.0: every interface)",
    ),
    query_bind: str | None = typer.Option(
        None,
        "--query-bind",
        help="the address queries are served at (STREAMKIT_QUERY_BIND; default 127.0.0.1: this machine only; "
        "0.0.0.0: every interface, which needs query_token and query_tls_certfile/keyfile)",
    ),
) -> None:
    """Run an app's processors until SIGTERM/SIGINT (checkpointing on the way out); SIGUSR1
    prints every thread's stack to stderr.

    The job's processor count is the app's (App(processors=...)) and changes with
    `streamkit scale`; --members only says how many group members this process runs."""
    from streamkit.cli import CliError

    if renamed is not None:
        raise CliError(
            "worker --processors is now --members (group members in this process); the job's processor "
            "count is App(processors=...) and changes with streamkit scale"
        )
    # the app's settings read them when it is loaded; they win over its App(...) arguments
    given_on_command_line(
        metrics_port=metrics_port, query_port=query_port, metrics_bind=metrics_bind, query_bind=query_bind
    )
    run_app(load_app(app_spec), members, broker=broker, embedded=embedded, log_level=log_level)


def run_app(
    app: App, members: int = 1, *, broker: str | None = None, embedded: bool = False, log_level: str = "INFO"
) -> None:
    """Run ``app``'s worker in this process until SIGTERM/SIGINT: ``streamkit worker``,
    and ``App.run()`` for ``python app.py``."""
    from streamkit.cli import CliError

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # `kill -USR1`: where it is stuck
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    if (problem := serving_problem(app.settings)) is not None:  # before anything else
        raise CliError(f"app {app.name!r}: {problem}")
    bootstrap = app.connection(broker)
    if bootstrap is None and not embedded:
        raise CliError(
            "no broker: give --broker or set STREAMKIT_BROKER (or --embedded-broker to start one for this worker)"
        )
    from streamkit.runtime.worker import run_worker

    run_worker(app, members, bootstrap, embedded=embedded)


def register(cli: typer.Typer) -> None:
    cli.command("worker")(worker)
