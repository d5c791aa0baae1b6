"""`streamkit status MODULE:APP`: workers, processors, partitions, lag, dead letters."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import typer
from rich.console import Console
from rich.table import Table

from streamkit.cli import CliError
from streamkit.cli.status_view import StatusView, caught_up, gather, processor_rows, rate_and_eta, view
from streamkit.loader import load_app
from streamkit.runtime.jobmeta import JobLayout
from streamkit.runtime.status import WorkerStatus

__all__ = ["dead_letters_table", "processors_table", "rate_and_eta", "register", "status", "stray_counts"]


def processors_table(job: JobLayout | None, statuses: list[WorkerStatus]) -> Table:
    """Every processor of the job and its state (``status_view.processor_rows``)."""
    table = Table(title="processors" + (f" (job epoch {job.epoch}, p0 {job.p0})" if job else ""))
    for col in ("processor", "state", "worker", "detail"):
        table.add_column(col)
    for row in processor_rows(job, statuses, time.time()):
        state = row["state"] if row["hosted"] else f"{row['state']} (no live worker)"
        table.add_row(str(row["processor"]), state, row["worker"], row["detail"])
    if job is not None and job.target is not None and job.target != job.p:
        table.caption = f"scaling {job.p} -> {job.target} processors"
    return table


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
    workers = Table(title=f"app {shown.app}: workers")
    for col in ("worker", "state", "processors", "handled", "dead letters", "failing run", "last error"):
        workers.add_column(col)
    for w in shown.workers:
        fail = f"[bold red]{w['failing_run']} FAILING[/]" if w["failing"] else str(w["failing_run"])
        workers.add_row(w["worker"], w["state"], ", ".join(map(str, w["processors"])) or "-", str(w["handled"]),
                        str(w["dead_letters"]), fail, w["last_error"])  # fmt: skip
    return workers


def global_tables_table(shown: StatusView) -> Table:
    """Each running worker's copy of each global table: keys held, records behind its topic."""
    table = Table(title="global tables (a copy on every worker)")
    for col in ("table", "worker", "keys", "lag", "left out"):
        table.add_column(col, justify="right" if col in ("keys", "lag") else "left")
    for g in shown.global_tables:
        left_out = ", ".join(f"{n} {reason}" for reason, n in sorted(g.get("skipped", {}).items())) or "-"
        table.add_row(g["table"], g["worker"], str(g["keys"]), str(g["lag"]), left_out)
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
        table.add_column(col, justify="right" if col in ("processor", "changelog lag") else "left")
    for row in shown.standbys:
        table.add_row(str(row["processor"]), row["worker"], str(row["lag"]), row["state"])
    return table


def partitions_table(shown: StatusView) -> Table:
    parts = Table(title=f"partitions (consumer group {shown.group})")
    cols = ("topic", "partition", "mode", "processor", "keys", "committed", "IC ranges", "high watermark", "lag",
            "strays")  # fmt: skip
    for col in cols:
        parts.add_column(
            col, justify="left" if col in ("topic", "mode", "keys", "strays") else "right", no_wrap=col == "keys"
        )
    for p in shown.partitions:
        parts.add_row(
            p["topic"],
            str(p["partition"]),
            p["mode"],
            ", ".join(map(str, p["processors"])) or "-",
            p["keys"],
            "-" if p["committed"] is None else str(p["committed"]),
            str(p["ic_ranges"]),
            str(p["high_watermark"]),
            str(p["lag"]),
            stray_counts(p["strays_forwarded"], p["strays_dead"], p["strays_waiting"]),
        )
    return parts


def status(
    app_spec: str = typer.Argument(..., metavar="MODULE:APP"),
    broker: str | None = typer.Option(None, "--broker", "-b", help="bootstrap address (default: the app's)"),
    wait: float | None = typer.Option(
        None,
        "--wait-caught-up",
        metavar="SECONDS",
        help="first wait until every active partition is committed up to its high watermark (exit 1 after SECONDS)",
    ),
) -> None:
    """Show the job: workers and their processors, per-partition progress and lag, dead letters."""
    console = Console(width=None if Console().is_terminal else 200)
    app = load_app(app_spec)
    bootstrap = app.connection(broker)
    if bootstrap is None:
        raise CliError("the app names no broker: pass --broker or set STREAMKIT_BROKER")
    found = asyncio.run(gather(app, bootstrap))
    deadline = time.monotonic() + (wait or 0)
    while wait is not None and not caught_up(found.offsets, found.shapes):
        if time.monotonic() > deadline:
            lag = sum(max(0, hw - (com or 0)) for com, hw in found.offsets.values())
            raise CliError(f"app {app.name} has not caught up after {wait:g} s (lag {lag:,} records)")
        time.sleep(0.5)
        found = asyncio.run(gather(app, bootstrap))
    shown = view(app, found)
    console.print(workers_table(shown))
    console.print(processors_table(found.job, found.statuses))
    console.print(partitions_table(shown))
    if shown.global_tables:
        console.print(global_tables_table(shown))
    if shown.standbys or app.settings.standby_replicas:
        console.print(standbys_table(shown, app.settings.standby_replicas))
    console.print(dead_letters_table(shown.dead_letters, app.dead_letter_topic))
    console.print(f"as of {time.strftime('%H:%M:%S')}")


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


def register(cli: typer.Typer) -> None:
    cli.command("status")(status)
