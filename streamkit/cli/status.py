"""`streamkit status MODULE:APP`: workers, processors, partitions, lag, dead letters, as
tables that read at 80 columns (or, with ``--json``, the dashboard's JSON document)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

import typer
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from streamkit.autoscale.journal import JournalReader
from streamkit.cli import CliError
from streamkit.cli.status_autoscale import autoscale_lines
from streamkit.cli.status_view import (
    DeadLetterCounts,
    Heartbeats,
    StatusView,
    caught_up,
    gather,
    rate_and_eta,
    view,
)
from streamkit.loader import load_app
from streamkit.runtime.status import STALE_AFTER

__all__ = [
    "WIDE",
    "dead_letters_table",
    "folded_partitions",
    "legend",
    "partitions_table",
    "processors_table",
    "rate_and_eta",
    "register",
    "skipped_line",
    "status",
    "stray_counts",
    "workers_table",
]

WIDE = 120
"""From this many columns on, the partitions table has a column for everything; below,
topic and partition share one, and the columns with nothing to show are left out."""


def stray_counts(forwarded: int, dead: int, waiting: int = 0) -> str:
    """A partition's strays: forwarded by the workers (as they last reported),
    dead-lettered, and waiting to be forwarded (``status_view.waiting_strays``)."""
    parts = [f"{forwarded} forwarded"] if forwarded else []
    if waiting:
        parts.append(f"[bold yellow]{waiting} waiting[/]")
    if dead:
        parts.append(f"{dead} misplaced (dead letters)")
    return ", ".join(parts) or "-"


def workers_table(shown: StatusView) -> Table:
    """One row per worker (``fitted`` keeps the names whole)."""
    workers = Table(title=f"app {shown.app}: workers")
    workers.add_column("worker", overflow="fold")
    workers.add_column("state")
    workers.add_column("processors")
    for col in ("handled", "dead letters", "failures in a row"):
        workers.add_column(col, justify="right")
    for w in shown.workers:
        fail = f"[bold red]{w['failing_run']} FAILING[/]" if w["failing"] else str(w["failing_run"])
        processors = ", ".join(map(str, w["processors"])) or "-"
        workers.add_row(escape(w["worker"]), w["state"], processors, f"{w['handled']:,}", str(w["dead_letters"]), fail)
    return workers


def processors_table(shown: StatusView) -> Table:
    """Every processor of the job and its state (``status_view.processor_rows``)."""
    title = "processors" + (f" (initial count {shown.p0}, job epoch {shown.job_epoch})" if shown.p0 else "")
    table = Table(title=title)
    table.add_column("processor")
    table.add_column("state")
    table.add_column("worker", overflow="fold")
    table.add_column("detail")
    for row in shown.processors:
        state = row["state"] if row["hosted"] else f"{row['state']} (no live worker)"
        table.add_row(str(row["processor"]), state, escape(row["worker"]), row["detail"])
    if shown.scaling:
        table.caption = f"scaling {shown.scaling} processors"
    return table


SKIPPED_PARTITIONS_NAMED = 3
"""The skipped-on-purpose line names up to this many partitions per kind (more: how many)."""


def skipped_line(shown: StatusView) -> str | None:
    """What the workers skipped on purpose, in one line (None: nothing), e.g. "skipped on
    purpose: 2 malformed (__streamkit_progress 2), 5 copies (orders/0 3, orders/1 2)"."""
    parts = []
    labels = (("malformed", "malformed", "malformed"), ("copies", "copy", "copies"),
              ("duplicate_strays", "duplicate stray", "duplicate strays"),
              ("missed_windows", "closed window missed by a late record", "closed windows missed by late records"),
              ("failed_unmatched", "failed join call for a record that met nobody",
               "failed join calls for records that met nobody"))  # fmt: skip
    named = ("malformed", "missed_windows", "failed_unmatched")  # per topic, table or join: few, all named
    for kind, one, many in labels:
        counts = {where: n for where, n in shown.skipped.get(kind, {}).items() if n}
        if not counts:
            continue
        if kind in named or len(counts) <= SKIPPED_PARTITIONS_NAMED:
            where = ", ".join(f"{escape(w)} {n:,}" for w, n in sorted(counts.items()))
        else:
            where = f"in {len(counts)} partitions"
        n = sum(counts.values())
        parts.append(f"{n:,} {one if n == 1 else many} ({where})")
    return "skipped on purpose: " + ", ".join(parts) if parts else None


def last_errors(shown: StatusView) -> list[str]:
    """Each worker's last error (a record dead-lettered), one paragraph each, under the
    workers table (markup escaped)."""
    return [f"last error on {escape(w['worker'])}: {escape(w['last_error'])}" for w in shown.workers if w["last_error"]]


def fitted(table: Table, width: int) -> RenderableType:
    """``table`` with its columns' widths set so that it fits ``width`` without cutting a
    word (rich, left alone, shrinks the widest column first and cuts headers and names):
    each column at least its longest word, the room left shared out as each would like
    more. Narrower than the longest words: each row as a paragraph (``stacked``)."""
    natural, least = [], []
    for col in table.columns:
        texts = [_plain(col.header), *(_plain(c) for c in col.cells)]
        natural.append(max(map(len, texts)))
        words = [len(t) if col.no_wrap else max(map(len, t.split()), default=0) for t in texts]
        least.append(max(words))
    if sum(natural) + _overhead(table) <= width:
        return table
    room = width - _overhead(table) - sum(least)
    if room < 0:
        table.pad_edge = False  # two columns more, before giving up on the table
        room = width - _overhead(table) - sum(least)
    if room < 0:
        return stacked(table)
    wants = [n - m for n, m in zip(natural, least, strict=True)]
    for col, m, want in zip(table.columns, least, wants, strict=True):
        col.width = m + room * want // max(sum(wants), 1)
    return table


def _overhead(table: Table) -> int:
    """The columns the table's borders and cell padding take."""
    n = len(table.columns)
    _, right, _, left = table.padding
    borders = 0 if table.box is None else n - 1 + (2 if table.show_edge else 0)
    return n * (left + right) - (0 if table.pad_edge else left + right) + borders


def _styled(cell: RenderableType) -> Text:
    """A table cell as text (a string's markup applied; anything else: empty)."""
    return cell if isinstance(cell, Text) else Text.from_markup(cell) if isinstance(cell, str) else Text()


def _plain(cell: RenderableType) -> str:
    return _styled(cell).plain


def stacked(table: Table) -> Group:
    """The table as paragraphs: its title, then per row the first cell, then each other
    cell after its column's name (for terminals too narrow for the table)."""
    columns = [[_styled(c) for c in col.cells] for col in table.columns]
    lines = [Text(_plain(table.title), style="italic")] if table.title else []
    for i in range(len(columns[0]) if columns else 0):
        line = Text.assemble(columns[0][i], style="bold")
        for col, cells in zip(table.columns[1:], columns[1:], strict=True):
            if cells[i].plain not in ("", "-"):
                line.append(f"  {_plain(col.header)}: ", style="dim")
                line.append_text(cells[i])
        lines.append(line)
    if table.caption:
        lines.append(Text(_plain(table.caption), style="italic"))
    return Group(*lines)


def global_tables_table(shown: StatusView) -> Table:
    """Each running worker's copy of each global table: keys held, records behind its topic."""
    table = Table(title="global tables (a copy on every worker)")
    for col in ("table", "worker", "keys", "lag", "left out"):
        table.add_column(col, justify="right" if col in ("keys", "lag") else "left", overflow="fold")
    for g in shown.global_tables:
        left_out = ", ".join(f"{n} {reason}" for reason, n in sorted(g.get("skipped", {}).items())) or "-"
        table.add_row(g["table"], escape(g["worker"]), str(g["keys"]), str(g["lag"]), left_out)
    return table


def standbys_table(shown: StatusView, replicas: int) -> Table:
    """Every standby copy (processor, worker, changelog lag, state), and the processors
    with fewer than asked for (fewer workers on other disks than replicas + 1)."""
    caption = None
    if shown.standbys_short:
        short = ", ".join(f"{pid} ({n} of {replicas})" for pid, n in sorted(shown.standbys_short.items()))
        caption = f"fewer standbys than standby_replicas={replicas}: processors {short}"
    table = Table(title="standbys (warm copies kept from the changelog)", caption=caption)
    for col in ("processor", "worker", "changelog lag", "state"):
        table.add_column(col, justify="right" if col in ("processor", "changelog lag") else "left", overflow="fold")
    for row in shown.standbys:
        table.add_row(str(row["processor"]), escape(row["worker"]), str(row["lag"]), row["state"])
    return table


def _folds(row: Mapping[str, Any]) -> bool:
    """A drained or reserved partition with nothing to show: no record left, no stray."""
    strays = row["strays_forwarded"] or row["strays_waiting"] or row["strays_dead"]
    return row["state"] in ("drained", "reserved") and row["lag"] <= 0 and not strays


def folded_partitions(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per kind of folded partition (``_folds``), e.g. "8 drained partitions (all
    consumed): orders/4-11"."""
    lines = []
    for state, why in (("drained", "all consumed"), ("reserved", "capacity not yet in use, nothing left to read")):
        parts = [(r["topic"], r["partition"]) for r in rows if r["state"] == state and _folds(r)]
        if parts:
            s = "" if len(parts) == 1 else "s"
            lines.append(f"{len(parts)} {state} partition{s} ({why}): {_spans(parts)}")
    return lines


def _spans(parts: list[tuple[str, int]]) -> str:
    """("orders", 4), ..., ("orders", 11), ("orders", 13) -> "orders/4-11, 13"."""
    out = []
    for topic in sorted({t for t, _ in parts}):
        numbers = sorted(p for t, p in parts if t == topic)
        runs: list[list[int]] = []
        for p in numbers:
            if runs and p == runs[-1][1] + 1:
                runs[-1][1] = p
            else:
                runs.append([p, p])
        out.append(f"{topic}/" + ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs))
    return "; ".join(out)


PARTITION_COLUMNS = ("topic", "partition", "mode", "processor", "keys", "committed", "IC ranges", "high watermark",
                     "lag", "strays")  # fmt: skip
"""The partitions table's columns, wide; narrow, "partition" is "topic/partition"."""


def partitions_table(shown: StatusView, width: int = 200, show_all: bool = False) -> tuple[Table, list[str]]:
    """The input partitions (drained and reserved ones with nothing to show folded, unless
    ``show_all``), and what the rows of the columns left out for ``width`` have
    (``WIDE``), e.g. "IC ranges 0"."""
    rows = [p for p in shown.partitions if show_all or not _folds(p)]
    wide = width >= WIDE
    shown_keys = any(p["keys"] not in ("all", "") for p in rows)
    shown_ic = any(p["ic_ranges"] for p in rows)
    shown_strays = any(p["strays_forwarded"] or p["strays_waiting"] or p["strays_dead"] for p in rows)
    shows = {"topic": wide, "keys": wide or shown_keys, "IC ranges": wide or shown_ic, "strays": wide or shown_strays}
    cols = [c for c in PARTITION_COLUMNS if shows.get(c, True)]
    table = Table(title=f"partitions (consumer group {shown.group})")
    for name in cols:
        right = name in ("processor", "committed", "IC ranges", "high watermark", "lag") or (
            wide and name == "partition"
        )
        table.add_column(name, justify="right" if right else "left", no_wrap=name == "keys", overflow="fold")
    for p in rows:
        cells = {
            "topic": p["topic"],
            "partition": str(p["partition"]) if wide else f"{p['topic']}/{p['partition']}",
            "mode": p["mode"],
            "processor": ", ".join(map(str, p["processors"])) or "-",
            "keys": p["keys"],
            "committed": "-" if p["committed"] is None else str(p["committed"]),
            "IC ranges": str(p["ic_ranges"]),
            "high watermark": str(p["high_watermark"]),
            "lag": str(p["lag"]),
            "strays": stray_counts(p["strays_forwarded"], p["strays_dead"], p["strays_waiting"]),
        }
        table.add_row(*(cells[name] for name in cols))
    left_out = [said for said, there in (("keys all", shown_keys), ("IC ranges 0", shown_ic), ("strays none",
                shown_strays)) if not wide and not there]  # fmt: skip
    return table, left_out


def legend(shown: StatusView, columns: list[str], failure_alarm_after: int) -> Table:
    """What the tables' labels mean: those shown only (``columns``: the partitions table's)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    items = [
        ("handled", "records a worker handled since it started"),
        ("failures in a row", f"records that failed one after another (FAILING from {failure_alarm_after} on)"),
        ("initial count", "the processor count keys are placed over: `scale` never goes below it"),
        ("job epoch", "grows by one as a scale change starts and at each of its steps"),
    ]
    if any(not p["hosted"] for p in shown.processors):
        items.append(("no live worker", f"no running worker reported hosting it in the last {STALE_AFTER:g} s"))
    items += [
        ("mode", "ReadWrite: read and written; ReadOnly: draining after a shrink; None: reserved or drained"),
        ("committed", "the group's position in the partition (the next offset it reads)"),
        ("high watermark", "the offset after the partition's last record; lag: the records in between"),
    ]
    if "keys" in columns:
        items.append(("keys", "all: its processor's alone; shared: processors split it by key hash (h%m=r)"))
    if "IC ranges" in columns:
        items.append(("IC ranges", "runs of records applied out of order above the committed offset"))
    if "strays" in columns:
        items.append(("strays", "records a plain producer put where the layout does not place their key"))
    if skipped_line(shown) is not None:
        items.append(
            (
                "skipped on purpose",
                "not lost: malformed = records in streamkit's internal topics it did not write (logged once "
                "each); copies = copies for compaction (the originals are applied); duplicate strays = second "
                "copies of forwarded strays",
            )
        )
    for label, meaning in items:
        grid.add_row(label, meaning)
    return grid


def dead_letters_table(reasons: Mapping[str, int], topic: str) -> Table:
    """The dead letters by reason, captioned with their topic: the table is at least as
    wide as the caption, so that a narrow terminal does not break the topic's name."""
    caption = f"topic {topic}"
    dl = Table(title="dead letters", caption=caption, min_width=len(caption) + 2)
    dl.add_column("reason")
    dl.add_column("records", justify="right")
    for reason, n in sorted(reasons.items()):
        dl.add_row(reason, str(n))
    if not reasons:
        dl.add_row("-", "0")
    return dl


def draw(console: Console, shown: StatusView, show_all: bool, failure_alarm_after: int, replicas: int) -> None:
    """Every table of ``shown`` fitted to the console, the folded partitions and the
    left-out columns said in words, then the legend."""
    width = console.width
    console.print(fitted(workers_table(shown), width))
    for line in last_errors(shown):
        console.print(line)
    console.print(fitted(processors_table(shown), width))
    if shown.unsettled and not shown.scaling:
        console.print("not settled: " + escape("; ".join(shown.unsettled)))
    for shown_line in autoscale_lines(shown.autoscale) if shown.autoscale is not None else []:
        console.print(fitted(shown_line, width) if isinstance(shown_line, Table) else shown_line)
    parts, left_out = partitions_table(shown, width, show_all)
    columns = [_plain(c.header) for c in parts.columns]
    console.print(fitted(parts, width))
    folded = [] if show_all else folded_partitions(shown.partitions)
    for line in folded:
        console.print(f"+ {line}")
    if folded:
        console.print("  (--all lists them)", style="dim")
    if left_out:
        console.print(f"every row has {', '.join(left_out)} (columns left out)", style="dim")
    if shown.global_tables:
        console.print(fitted(global_tables_table(shown), width))
    if shown.standbys or replicas:
        console.print(fitted(standbys_table(shown, replicas), width))
    console.print(dead_letters_table(shown.dead_letters, shown.dead_letter_topic))
    if (said := skipped_line(shown)) is not None:
        console.print(said)
    console.print(legend(shown, columns, failure_alarm_after), style="dim")
    console.print(f"as of {time.strftime('%H:%M:%S', time.localtime(shown.at))}")


def status(
    app_spec: str = typer.Argument(..., metavar="MODULE:APP"),
    broker: str | None = typer.Option(None, "--broker", "-b", help="bootstrap address (default: the app's)"),
    wait: float | None = typer.Option(
        None,
        "--wait-caught-up",
        metavar="SECONDS",
        help="first wait until every active partition is committed up to its high watermark (exit 1 after SECONDS)",
    ),
    show_all: bool = typer.Option(
        False, "--all", "-a", help="every partition: drained and reserved ones with nothing to show too"
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="print one JSON document instead (the dashboard's /api/status): app, group, dead_letter_topic, at, "
        "job_epoch, p0, processor_count, target, scaling, unsettled, workers, processors, partitions (all of "
        "them), dead_letters, global_tables, standbys, standbys_short, skipped (records skipped on purpose: "
        "malformed per internal topic, copies and duplicate_strays per topic/partition), autoscale (the autoscaler's "
        "inputs and decisions, null if none ran in the last 10 minutes)",
    ),
) -> None:
    """Show the job: workers and their processors, per-partition progress and lag, dead letters.

    Fits an 80-column terminal: drained and reserved partitions with nothing to show fold
    into one line each (--all lists them), columns with nothing to show are left out below
    120 columns, and a legend under the tables says what their labels mean.
    """
    app = load_app(app_spec)
    bootstrap = app.connection(broker)
    if bootstrap is None:
        raise CliError("the app names no broker: pass --broker or set STREAMKIT_BROKER")
    dead, beats, journal = DeadLetterCounts(), Heartbeats(app.name), JournalReader(app.name)  # read on
    found = asyncio.run(gather(app, bootstrap, dead, beats, journal))
    deadline = time.monotonic() + (wait or 0)
    while wait is not None and not caught_up(found.offsets, found.shapes):
        if time.monotonic() > deadline:
            lag = sum(max(0, hw - (com or 0)) for com, hw in found.offsets.values())
            raise CliError(f"app {app.name} has not caught up after {wait:g} s (lag {lag:,} records)")
        time.sleep(0.5)
        found = asyncio.run(gather(app, bootstrap, dead, beats, journal))
    shown = view(app, found)
    if as_json:
        import orjson

        typer.echo(orjson.dumps(shown.as_dict(), option=orjson.OPT_INDENT_2).decode())
        return
    # a terminal's width, or $COLUMNS; into a pipe or file without COLUMNS: wide, rows not cut
    console = Console(width=None if Console().is_terminal or os.environ.get("COLUMNS", "").isdigit() else 200)
    settings = app.settings
    draw(console, shown, show_all, settings.failure_alarm_after, settings.standby_replicas)


def register(cli: typer.Typer) -> None:
    cli.command("status")(status)
