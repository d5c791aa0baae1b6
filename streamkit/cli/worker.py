"""`streamkit worker MODULE:APP`: run processors of an app in this process."""

from __future__ import annotations

import logging

import typer

from streamkit.loader import load_app


def worker(
    app_spec: str = typer.Argument(..., metavar="MODULE:APP", help="the App to run, e.g. examples.orders:app"),
    processors: int = typer.Option(1, "--processors", "-k", min=1, help="group members in this process"),
    broker: str | None = typer.Option(None, "--broker", "-b", help="bootstrap address (default: the app's)"),
    log_level: str = typer.Option("INFO", "--log-level"),
) -> None:
    """Run an app's processors until SIGTERM/SIGINT (checkpointing on the way out)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    app = load_app(app_spec)
    from streamkit.runtime.worker import run_worker

    run_worker(app, processors, broker)


def register(cli: typer.Typer) -> None:
    cli.command("worker")(worker)
