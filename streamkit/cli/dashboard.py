"""`streamkit dashboard MODULE:APP`: what `status` shows, live in a browser (lag and
committed rate per partition as charts over the last minutes, processors with their
bootstrap or restore progress, workers, strays, dead letters, and the events between
two looks: a scale step, a processor changing state, a worker coming or going)."""

from __future__ import annotations

import asyncio
import contextlib

import typer

from streamkit.loader import load_app


def dashboard(
    app_spec: str = typer.Argument(..., metavar="MODULE:APP"),
    port: int = typer.Option(8088, "--port", "-p", help="port to serve the page on"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to serve on (0.0.0.0: every interface)"),
    broker: str | None = typer.Option(None, "--broker", "-b", help="bootstrap address (default: the app's)"),
) -> None:
    """Serve a live dashboard of the job (open the printed address in a browser)."""
    from streamkit.autoscale.journal import JournalReader
    from streamkit.cli import CliError
    from streamkit.cli.status_view import DeadLetterCounts, Heartbeats, gather, view
    from streamkit.ops.dashboard import serve_dashboard

    app = load_app(app_spec)
    bootstrap = app.connection(broker)
    if bootstrap is None:
        raise CliError("the app names no broker: pass --broker or set STREAMKIT_BROKER")

    dead, beats, journal = DeadLetterCounts(), Heartbeats(app.name), JournalReader(app.name)  # read on

    async def snapshot() -> dict[str, object]:
        assert bootstrap is not None
        return view(app, await gather(app, bootstrap, dead, beats, journal)).as_dict()

    async def run() -> None:
        try:
            stop = await serve_dashboard(snapshot, port, host)
        except OSError as exc:
            raise CliError(f"cannot serve the dashboard on {host}:{port}: {exc.strerror or exc}") from None
        typer.echo(f"dashboard of app {app.name}: http://{host}:{port}/ (Ctrl-C to stop)", err=True)
        try:
            await asyncio.Event().wait()
        finally:
            await stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


def register(cli: typer.Typer) -> None:
    cli.command("dashboard")(dashboard)
