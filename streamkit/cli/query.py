"""`streamkit query MODULE:APP TABLE KEY [--windows]`: a key's value (or its windows) in a
running job's table.

Asks any live worker that answers queries (``--query-port``); it forwards to the worker
hosting the key's processor. Prints the answer as JSON (value, processor, worker, the
processor's input positions). Sends the app's ``query_token`` (STREAMKIT_QUERY_TOKEN);
an ``https`` worker's certificate is checked against ``--cafile`` (else the app's
``query_tls_cafile``, else the system's trusted CAs)."""

from __future__ import annotations

import asyncio
import json

import typer

from streamkit.loader import load_app


def query(
    app_spec: str = typer.Argument(..., metavar="MODULE:APP"),
    table: str = typer.Argument(..., help="a table of the app"),
    key: str = typer.Argument(..., help="the key, as its record key's text"),
    url: str | None = typer.Option(None, "--url", help="a worker's query URL (else found from the heartbeats)"),
    windows: bool = typer.Option(False, "--windows", help="every window of the key (a windowed table)"),
    broker: str | None = typer.Option(
        None, "--broker", "-b", help="bootstrap address (else the app's broker or STREAMKIT_BROKER)"
    ),
    cafile: str | None = typer.Option(
        None,
        "--cafile",
        help="CA bundle (PEM) for https workers' certificates (else the app's query_tls_cafile, "
        "STREAMKIT_QUERY_TLS_CAFILE)",
    ),
) -> None:
    """Print a key's value in a running job's table, from the processor that owns it."""
    from streamkit.cli import CliError
    from streamkit.kafkaio import KafkaIO
    from streamkit.query import Client, query_url

    app = load_app(app_spec)
    bootstrap = app.connection(broker)
    if url is None and bootstrap is None:
        raise CliError("no broker: give --broker or set STREAMKIT_BROKER (or a worker's --url)")

    async def run() -> dict[str, object]:
        where = url
        if where is None:
            assert bootstrap is not None
            async with KafkaIO(bootstrap) as io:
                where = await query_url(io, app.name)
        settings = app.settings
        trust = cafile or settings.query_tls_cafile
        async with Client(where, token=settings.query_token, cafile=trust) as client:
            return await (client.windows(table, key) if windows else client.get(table, key))

    typer.echo(json.dumps(asyncio.run(run()), indent=1))


def register(cli: typer.Typer) -> None:
    cli.command("query")(query)
