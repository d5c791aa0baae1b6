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
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="address to serve on (0.0.0.0: every interface, which needs the app's query_token and "
        "query_tls_certfile/keyfile; open the page as URL#token=TOKEN)",
    ),
    broker: str | None = typer.Option(None, "--broker", "-b", help="bootstrap address (default: the app's)"),
) -> None:
    """Serve a live dashboard of the job (open the printed address in a browser)."""
    from streamkit.autoscale.journal import JournalReader
    from streamkit.cli import CliError
    from streamkit.cli.status_view import DeadLetterCounts, Heartbeats, gather, view
    from streamkit.ops.dashboard import serve_dashboard
    from streamkit.ops.exposure import dashboard_problem, loopback
    from streamkit.ops.queries import server_tls

    app = load_app(app_spec)
    settings = app.settings
    if (problem := dashboard_problem(settings, host)) is not None:
        raise CliError(f"app {app.name!r}: {problem}")
    bootstrap = app.connection(broker)
    if bootstrap is None:
        raise CliError("the app names no broker: pass --broker or set STREAMKIT_BROKER")
    token = settings.query_token.get_secret_value() if settings.query_token else None
    cert, key = settings.query_tls_certfile, settings.query_tls_keyfile  # both or neither (the settings say so)
    # HTTPS beyond this machine (the queries' certificate names the host others reach);
    # on this machine plain HTTP, as the queries' certificate does not name 127.0.0.1.
    tls = server_tls(cert, key) if cert and key and not loopback(host) else None
    shown = page_address(host, port, tls is not None, settings.query_host, bool(token))

    dead, beats, journal = DeadLetterCounts(), Heartbeats(app.name), JournalReader(app.name)  # read on

    async def snapshot() -> dict[str, object]:
        assert bootstrap is not None
        return view(app, await gather(app, bootstrap, dead, beats, journal)).as_dict()

    async def run() -> None:
        try:
            stop = await serve_dashboard(snapshot, port, host, token=token, ssl_context=tls)
        except OSError as exc:
            raise CliError(f"cannot serve the dashboard on {host}:{port}: {exc.strerror or exc}") from None
        typer.echo(f"dashboard of app {app.name}: {shown} (Ctrl-C to stop)", err=True)
        try:
            await asyncio.Event().wait()
        finally:
            await stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


def page_address(host: str, port: int, tls: bool, query_host: str | None, token: bool) -> str:
    """The address to open the page at: over HTTPS, the name others reach this machine at
    (``query_host``, else this machine's), which its certificate holds; an address of every
    interface is no address to open; the token in the fragment when there is one."""
    import socket

    if tls or host in ("0.0.0.0", "::"):
        host = query_host or socket.getfqdn()
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}/" + ("#token=YOUR_QUERY_TOKEN" if token else "")


def register(cli: typer.Typer) -> None:
    cli.command("dashboard")(dashboard)
