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

import typer

__all__ = ["COMMANDS", "CliError", "app", "main"]

# Sub-command modules under streamkit/cli/, registered in this order.
COMMANDS: list[str] = ["broker", "worker", "status", "topics", "produce", "scale", "backfill", "reset"]

app = typer.Typer(
    name="streamkit",
    help="streamkit: stateful stream processing on Kafka with live partition and processor scaling.\n\n"
    "The broker, for every command: --broker, else the app's (App(broker=...)) or STREAMKIT_BROKER, else "
    "one line saying so; the worker starts an embedded broker only with --embedded-broker.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class CliError(Exception):
    """An error to show the user as one line (no traceback)."""


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"streamkit {version('streamkit')}")
        raise typer.Exit()


@app.callback()
def _root(
    _version_: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="print the version"),
) -> None:
    """streamkit command line."""


for _name in COMMANDS:
    importlib.import_module(f"{__name__}.{_name}").register(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``streamkit`` console script."""
    try:
        app(args=argv, prog_name="streamkit")
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # one readable line, not a traceback
        if os.environ.get("STREAMKIT_DEBUG") == "1":
            raise
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        from streamkit.errors import BrokerUnreachableError, ConfigError

        plain = isinstance(exc, (CliError, BrokerUnreachableError, ConfigError))
        if not plain and not type(exc).__module__.startswith("streamkit.broker"):
            message = f"{type(exc).__name__}: {message}"
        print(f"error: {message}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
