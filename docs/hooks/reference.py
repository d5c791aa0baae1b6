"""MkDocs hook: the command-line and settings reference pages, generated from the code at
every build, so that they cannot drift from it.

- ``reference/cli.md``: every command, sub-command, argument and option of the ``streamkit``
  command (the click command tree under the typer app ``streamkit.cli.app``), rendered by
  typer's own Markdown generator (the one ``typer ... utils docs`` uses).
- ``reference/settings.md``: every field of ``streamkit.settings.Settings`` with its
  ``STREAMKIT_*`` environment variable, type, default, bounds and description.

Neither page exists as a file in ``docs/``: both are added to the build here.
"""

from __future__ import annotations

import html
import types
import typing
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

CLI_PAGE = "reference/cli.md"
SETTINGS_PAGE = "reference/settings.md"


def on_files(files: Files, config: Any) -> Files:
    for uri, content in ((CLI_PAGE, cli_page()), (SETTINGS_PAGE, settings_page())):
        files.append(File.generated(config, uri, content=content))
    return files


# -- the command line ------------------------------------------------------------------------


def cli_page() -> str:
    import typer
    from typer.cli import get_docs_for_click

    from streamkit.cli import app

    command = typer.main.get_command(app)
    ctx = command.context_class(command, info_name="streamkit")
    body = get_docs_for_click(obj=command, ctx=ctx, name="streamkit", title="Command line")
    intro = (
        "<!-- generated at build time from streamkit.cli by docs/hooks/reference.py: do not edit -->\n\n"
        "Every command and option of `streamkit`, generated from the command itself at every build "
        "of this site (`streamkit COMMAND --help` prints the same). The connection options of "
        "`streamkit` itself (`--client-config`, `--security-protocol`, ...) apply to every command, "
        "and are accepted after the command's name too; see [Connecting to a cluster]"
        "(../guides/connecting.md). Every setting not listed here is an `App(...)` argument or a "
        "`STREAMKIT_*` variable: see [Settings](settings.md).\n\n"
    )
    title, _, rest = body.partition("\n\n")
    return f"{title}\n\n{intro}{rest}"


# -- the settings ----------------------------------------------------------------------------


def settings_page() -> str:
    from streamkit.settings import LOW_LATENCY, Settings

    prefix = Settings.model_config.get("env_prefix", "")
    sections = []
    for name, field in Settings.model_fields.items():
        facts = [f"`{prefix}{name.upper()}`", _text(_type_name(field.annotation)), f"default `{_default(field)}`"]
        if bounds := _bounds(field.metadata):
            facts.append(_text(bounds))
        sections += [f"### `{name}` {{ #{name} }}", "", " · ".join(facts), ""]
        if field.description:
            sections += [_text(field.description), ""]
    preset = ", ".join(f"`{k}={v!r}`" for k, v in LOW_LATENCY.items())
    return "\n".join(
        [
            "# Settings",
            "",
            "<!-- generated at build time from streamkit.settings by docs/hooks/reference.py: do not edit -->",
            "",
            "Every setting of a job, generated from `streamkit.settings.Settings` at every build of this "
            "site. Each one is an argument of `streamkit.App(...)` or an environment variable: "
            f'`App("orders", commit_interval=5)` or `{prefix}COMMIT_INTERVAL=5`. An argument given to '
            "`App` wins over the variable; the variable wins over the default. The few settings the "
            "command line takes (`streamkit worker --query-port`, `--query-bind`, `--metrics-port`, "
            "`--metrics-bind`, and the connection options) win over both: they are the operator's word "
            "for that process. A bad value stops the app with one line naming the setting, where its "
            "value came from (the option, the argument or the variable) and the value; so does a "
            f"`{prefix}*` variable that is no setting but nearly spells one (`{prefix}COMMIT_INTERVALL`). "
            "Below, each setting with its variable, its type, its default and its bounds.",
            "",
            f'`latency="low"` is a preset: it sets {preset} for those of them not given explicitly.',
            "",
            '`App(..., sasl_oauth_token_provider=...)` (for `sasl_mechanism="OAUTHBEARER"`: an aiokafka '
            "`AbstractTokenProvider`, whose `token()` returns the token) is an argument of `App` only: it is "
            "code, not a value a variable can hold.",
            "",
            *sections,
        ]
    )


def _text(text: str) -> str:
    """Plain text for Markdown: on one line, ``<`` and ``>`` escaped, and ``*`` outside code
    spans (```ssl.*```) kept from starting emphasis."""
    parts = html.escape(" ".join(text.split()), quote=False).split("`")
    return "`".join(part if i % 2 else part.replace("*", "\\*") for i, part in enumerate(parts))


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if typing.get_origin(annotation) is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "None"
    if annotation is Path:
        return "path"
    name = getattr(annotation, "__name__", str(annotation))
    return {"SecretStr": "secret text (never printed or logged)"}.get(name, name)


def _default(field: Any) -> str:
    value = field.get_default(call_default_factory=True)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"{value:,} ({value >> 20} MiB)"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 10_000:
        return f"{value:,}"
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def _bounds(metadata: list[Any]) -> str:
    words = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    found = []
    for item in metadata:
        for attr, sign in words.items():
            value = getattr(item, attr, None)
            if value is not None:
                found.append(f"{sign} {value:,}" if isinstance(value, int) else f"{sign} {value}")
    return ", ".join(found)
