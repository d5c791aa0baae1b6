"""The ``streamkit`` command line: a thin registry of sub-commands.

Each sub-command lives in its own module ``streamkit/cli/<name>.py`` exposing
``register(app: typer.Typer) -> None`` (which adds one or more commands, e.g. with
``app.command("name")(function)``). To add one: write the module, add its name to
``COMMANDS`` below. Keep module imports light (import heavy things inside the command
function) so ``streamkit --help`` stays fast.

Errors: raise ``CliError`` (or any exception with a readable message) from a command;
``main()`` prints it as one line ``error: <message>`` and exits with status 1.
Set STREAMKIT_DEBUG=1 to get the full traceback instead.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import typer

from streamkit.errors import StreamkitError
from streamkit.settings import forget_command_line, given_on_command_line

__all__ = ["COMMANDS", "CONNECTION_OPTIONS", "CliError", "app", "error_line", "hoist_connection_options", "main"]

# Sub-command modules under streamkit/cli/, registered in this order.
COMMANDS: list[str] = [
    "broker", "worker", "status", "dashboard", "topics", "produce", "consume", "scale", "autoscale", "backfill",
    "reset", "query",
]  # fmt: skip

app = typer.Typer(
    name="streamkit",
    help="streamkit: stateful stream processing on Kafka with live partition and processor scaling.\n\n"
    "The broker, for every command: --broker, else the app's (App(broker=...)) or STREAMKIT_BROKER, else "
    "one line saying so; the worker starts an embedded broker only with --embedded-broker.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class CliError(StreamkitError):
    """An error to show the user as one line (no traceback)."""


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"streamkit {version('streamkit')}")
        raise typer.Exit()


_SECURITY = "Connection (for every command; the same as the STREAMKIT_* variables)"


@app.callback()
def _root(
    _version_: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="print the version"),
    broker: str | None = typer.Option(
        None,
        "--broker",
        "-b",
        help="bootstrap address for the command that follows (as STREAMKIT_BROKER; the command's own --broker wins)",
        rich_help_panel=_SECURITY,
    ),
    client_config: Path | None = typer.Option(
        None,
        "--client-config",
        help="a Kafka client properties file: bootstrap.servers, security.protocol, ssl.*, sasl.* "
        "(STREAMKIT_CLIENT_CONFIG)",
        rich_help_panel=_SECURITY,
    ),
    security_protocol: str | None = typer.Option(
        None, "--security-protocol", help="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL", rich_help_panel=_SECURITY
    ),
    ssl_cafile: Path | None = typer.Option(
        None, "--ssl-cafile", help="CA bundle (PEM) for the brokers' certificates", rich_help_panel=_SECURITY
    ),
    ssl_certfile: Path | None = typer.Option(
        None, "--ssl-certfile", help="client certificate (PEM), for mutual TLS", rich_help_panel=_SECURITY
    ),
    ssl_keyfile: Path | None = typer.Option(
        None, "--ssl-keyfile", help="client key (PEM), for mutual TLS", rich_help_panel=_SECURITY
    ),
    sasl_mechanism: str | None = typer.Option(
        None,
        "--sasl-mechanism",
        help="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; the password comes from STREAMKIT_SASL_PASSWORD or the "
        "properties file, never from the command line (which every user of the machine can read)",
        rich_help_panel=_SECURITY,
    ),
    sasl_username: str | None = typer.Option(None, "--sasl-username", rich_help_panel=_SECURITY),
) -> None:
    """streamkit command line."""
    given = {
        "broker": broker,
        "client_config": client_config,
        "security_protocol": security_protocol,
        "ssl_cafile": ssl_cafile,
        "ssl_certfile": ssl_certfile,
        "ssl_keyfile": ssl_keyfile,
        "sasl_mechanism": sasl_mechanism,
        "sasl_username": sasl_username,
    }
    # Every command (and the app a worker loads) reads its connection from the settings:
    # an option here wins over the App's arguments and the STREAMKIT_* variables, and is
    # the STREAMKIT_* variable of the processes a command starts.
    forget_command_line()
    given_on_command_line(**{name: str(value) if isinstance(value, Path) else value for name, value in given.items()})
    for name, value in given.items():
        if value is not None:
            os.environ[f"STREAMKIT_{name.upper()}"] = str(value)


for _name in COMMANDS:
    importlib.import_module(f"{__name__}.{_name}").register(app)


def root_options() -> list[str]:
    """The connection options this process's command line gave, as options of the root
    command: for the commands a command starts (``autoscale``'s workers), so that they win
    over the App's arguments there too."""
    from streamkit.settings import COMMAND_LINE

    root = {
        "broker": "--broker",
        "client_config": "--client-config",
        **{o[2:].replace("-", "_"): o for o in CONNECTION_OPTIONS},
    }
    return [part for name, option in root.items() if name in COMMAND_LINE for part in (option, str(COMMAND_LINE[name]))]


CONNECTION_OPTIONS = (
    "--client-config",
    "--security-protocol",
    "--ssl-cafile",
    "--ssl-certfile",
    "--ssl-keyfile",
    "--sasl-mechanism",
    "--sasl-username",
)
"""The root's connection options: accepted after the sub-command too."""


def hoist_connection_options(argv: list[str]) -> list[str]:
    """``argv`` with the connection options (and their values) moved before the
    sub-command, where the root command takes them: ``streamkit topics create T
    --client-config F`` works as ``streamkit --client-config F topics create T``."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        if arg.split("=", 1)[0] in CONNECTION_OPTIONS:
            take = 1 if "=" in arg else 2
            front.extend(argv[i : i + take])
            i += take
            continue
        rest.append(arg)
        i += 1
    return front + rest


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``streamkit`` console script."""
    try:
        app(args=hoist_connection_options(sys.argv[1:] if argv is None else argv), prog_name="streamkit")
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # one readable line, not a traceback
        if os.environ.get("STREAMKIT_DEBUG") == "1":
            raise
        print(f"error: {error_line(exc)}", file=sys.stderr)
        sys.exit(1)


def error_line(exc: BaseException) -> str:
    """What went wrong, in words, as one line: streamkit's own errors say it themselves;
    a file the command could not read or a value it could not take is named plainly; only
    something unexpected names its Python type, with how to see where it came from."""
    text = str(exc).strip()
    message = text.splitlines()[0] if text else ""
    if isinstance(exc, StreamkitError) or type(exc).__module__.startswith("streamkit.broker"):
        return message or type(exc).__name__
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"no such file: {exc.filename}"
    if isinstance(exc, PermissionError) and exc.filename:
        return f"not allowed to read or write {exc.filename}"
    if isinstance(exc, ValueError) and message:  # a value the command could not take (a TypeError is a bug)
        return message
    if isinstance(exc, ConnectionError | TimeoutError):
        return f"the connection failed: {message or 'timed out'}"
    kind = type(exc).__name__
    return f"unexpected {kind}{': ' + message if message else ''} (STREAMKIT_DEBUG=1 shows where)"


if __name__ == "__main__":
    main()
