"""``streamkit topics``: create, expand, shrink and describe topic layouts.

    streamkit topics create T --partitions N [--capacity C]
    streamkit topics expand T --partitions N2
    streamkit topics shrink T --partitions N2 [--delay D]
    streamkit topics describe T [--group G]
    streamkit topics finish-drain T [--group G] [--partition P] [--force]
    streamkit topics resume T
    streamkit topics ordered-delivery T on|off
    streamkit topics check T
    streamkit topics list [--all] [--json]

Expansion grows the physical topic with CreatePartitions when the reserved capacity
is not enough and the broker supports it; otherwise it says what to do.  Errors are
one line (``error: ...``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import typer

from streamkit.cli import CliError

T = TypeVar("T")

app = typer.Typer(
    name="topics",
    help="Create, expand, shrink and describe topics and their layouts (live, in key order).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

BrokerOpt = typer.Option(
    None, "--broker", "-b", envvar="STREAMKIT_BROKER", help="bootstrap address of the cluster (else STREAMKIT_BROKER)"
)


def _broker(broker: str | None) -> Any:
    """The connection to ``broker`` (else STREAMKIT_BROKER, else the client properties
    file of STREAMKIT_CLIENT_CONFIG), secured as the STREAMKIT_* variables say."""
    from streamkit.settings import connection_settings, load_settings

    connection = connection_settings(load_settings("streamkit", {}), broker)
    if connection is None:
        raise CliError("no broker: give --broker or set STREAMKIT_BROKER")
    return connection


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="topics")


def _run(fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    from streamkit.kafkaio import KafkaIOError
    from streamkit.layout.model import LayoutError

    try:
        return asyncio.run(fn())
    except (LayoutError, KafkaIOError) as exc:
        raise CliError(str(exc)) from None


def _coordinator(broker: str | None, ack_timeout: float | None = None, rf: int = 1) -> Any:
    from rich.console import Console

    from streamkit.layout.protocol import DEFAULT_ACK_TIMEOUT, LayoutCoordinator

    err = Console(stderr=True)
    return LayoutCoordinator(
        _broker(broker),
        ack_timeout=ack_timeout or DEFAULT_ACK_TIMEOUT,
        replication_factor=rf,
        progress=lambda msg: err.print(f"[dim]{msg}[/dim]"),
    )


@app.command()
def create(
    topic: str = typer.Argument(..., help="topic name"),
    partitions: int = typer.Option(..., "--partitions", "-p", min=1, help="initial (and active) partition count N0"),
    capacity: int | None = typer.Option(None, "--capacity", "-c", help="physical partitions to reserve (>= N0)"),
    ordered: bool = typer.Option(
        True, "--ordered-delivery/--no-ordered-delivery", help="gate consumers across layout changes"
    ),
    replication_factor: int = typer.Option(1, "--replication-factor", "-r", min=1),
    compacted: bool = typer.Option(
        False,
        "--compacted",
        help="cleanup.policy=compact (streamkit's producer then also writes a record to the "
        "partitions its key's partition was split from, so compaction there drops the key's older values)",
    ),
    broker: str | None = BrokerOpt,
) -> None:
    """Create a topic (if missing) and its layout; adopt an existing topic without one."""
    configs = {"cleanup.policy": "compact"} if compacted else None

    async def go() -> Any:
        async with _coordinator(broker, rf=replication_factor) as co:
            return await co.create(topic, partitions, capacity=capacity, ordered_delivery=ordered, configs=configs)

    lay = _run(go)
    typer.echo(f"created {topic}: {lay.active} partitions active of {lay.physical} physical, epoch {lay.epoch}")


@app.command()
def expand(
    topic: str = typer.Argument(...),
    partitions: int = typer.Option(..., "--partitions", "-p", min=1, help="new active partition count"),
    ack_timeout: float | None = typer.Option(None, "--ack-timeout", help="seconds to wait for producers' acks"),
    broker: str | None = BrokerOpt,
) -> None:
    """Grow the active partition count; new partitions are delivered after their parents' seals."""

    async def go() -> Any:
        async with _coordinator(broker, ack_timeout) as co:
            return await co.expand(topic, partitions)

    res = _run(go)
    _report("expanded", topic, res)


@app.command()
def shrink(
    topic: str = typer.Argument(...),
    partitions: int = typer.Option(..., "--partitions", "-p", min=1, help="new active partition count (>= N0)"),
    delay: float = typer.Option(
        300.0, "--delay", "-d", min=0, help="seconds the removed partitions stay readable (draining) at least"
    ),
    ack_timeout: float | None = typer.Option(None, "--ack-timeout", help="seconds to wait for producers' acks"),
    broker: str | None = BrokerOpt,
) -> None:
    """Reduce the active partition count; removed partitions drain (ReadOnly), then are given up."""

    async def go() -> Any:
        async with _coordinator(broker, ack_timeout) as co:
            return await co.shrink(topic, partitions, delay=delay)

    res = _run(go)
    _report("shrunk", topic, res)


def _report(verb: str, topic: str, res: Any) -> None:
    lay = res.layout
    extra = f", given up first: {list(res.finished_drains)}" if res.finished_drains else ""
    fenced = f"; FENCED (no ack in time): {', '.join(sorted(res.fenced))}" if res.fenced else ""
    typer.echo(
        f"{verb} {topic}: {lay.active} partitions active, epoch {lay.epoch}; "
        f"{len(res.acked)} producer(s) acknowledged in {res.waited:.2f} s{fenced}{extra}"
    )


@app.command()
def resume(topic: str = typer.Argument(...), broker: str | None = BrokerOpt) -> None:
    """Finish a change whose coordinator stopped between announcement and seal."""

    async def go() -> Any:
        async with _coordinator(broker) as co:
            return await co.resume(topic)

    _report("sealed", topic, _run(go))


@app.command("finish-drain")
def finish_drain(
    topic: str = typer.Argument(...),
    partition: list[int] = typer.Option(None, "--partition", "-P", help="only these draining partitions"),
    group: list[str] = typer.Option(None, "--group", "-g", help="give up a partition once these groups drained it"),
    force: bool = typer.Option(False, "--force", help="give up the named (or all) draining partitions now"),
    broker: str | None = BrokerOpt,
) -> None:
    """Give up draining partitions (ReadOnly -> None): due, drained by --group, or --force."""

    async def go() -> Any:
        async with _coordinator(broker) as co:
            return await co.finish_drain(topic, partition or None, groups=group or (), force=force)

    lay, done, kept = _run(go)
    if done:
        typer.echo(f"{topic}: gave up partitions {list(done)} (epoch {lay.epoch})")
    for p, why in sorted(kept.items()):
        typer.echo(f"{topic}: partition {p} kept: {why}")
    if not done and not kept:
        typer.echo(f"{topic}: no partition is draining")


@app.command("ordered-delivery")
def ordered_delivery(
    topic: str = typer.Argument(...),
    state: str = typer.Argument(..., help="on or off"),
    broker: str | None = BrokerOpt,
) -> None:
    """Turn ordered delivery across layout changes on or off for a topic."""
    if state not in ("on", "off"):
        raise CliError(f"state must be 'on' or 'off', got {state!r}")

    async def go() -> Any:
        async with _coordinator(broker) as co:
            return await co.set_ordered_delivery(topic, state == "on")

    lay = _run(go)
    typer.echo(f"{topic}: ordered delivery {state} (epoch {lay.epoch})")


@app.command()
def check(topic: str = typer.Argument(...), broker: str | None = BrokerOpt) -> None:
    """Scan a topic for late records (producers that missed a change) and for strays (records
    a plain producer put where the layout does not place them); exit 2 on ordering
    violations, 1 when strays were dead-lettered or still wait to be forwarded."""
    from streamkit.layout.check import check_topic

    bootstrap = _broker(broker)
    rep = _run(lambda: check_topic(bootstrap, topic))
    counts = ", ".join(f"{k} {v}" for k, v in sorted(rep.counts.items())) or "no records"
    typer.echo(f"{topic} (epoch {rep.epoch}): {counts}; harmless late {rep.late_harmless}")
    total, missing = sum(rep.strays.values()), sum(rep.unforwarded.values())
    if total:
        where = ", ".join(
            f"{p}: {n}" + (f" ({rep.unforwarded[p]} not forwarded)" if p in rep.unforwarded else "")
            for p, n in sorted(rep.strays.items())
        )
        verdict = "all forwarded" if not missing else f"{missing} not forwarded (dead-lettered, or waiting)"
        typer.echo(f"strays {total}, {verdict}; per partition {where}")
    for v in rep.violations[:50]:
        typer.echo(
            f"  VIOLATION {v['status']}: partition {v['partition']} offset {v['offset']} key {v['key']!r} "
            f"producer {v['producer']} epoch {v['record_epoch']} (sealed at {v['seal_epoch']})"
        )
    if rep.violations:
        raise typer.Exit(2)
    if sum(rep.unforwarded.values()):
        raise typer.Exit(1)


@app.command("list")
def list_topics(
    all_: bool = typer.Option(False, "--all", "-a", help="also internal topics (names starting with __)"),
    as_json: bool = typer.Option(
        False, "--json", help="a JSON list: topic, partitions, active and epoch (null without a layout), internal"
    ),
    broker: str | None = BrokerOpt,
) -> None:
    """List the broker's topics with their partitions (and active ones, where a layout says).

    PARTITIONS: what the broker has. ACTIVE: those producers write to, by the topic's streamkit layout.

    (The rest are reserved capacity, or draining after a shrink. '-': the topic has no layout.)"""
    bootstrap = _broker(broker)
    rows = _run(lambda: _topic_rows(bootstrap))
    shown = [r for r in rows if all_ or not r["internal"]]
    if as_json:
        import orjson

        typer.echo(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode())
        return
    hidden = len(rows) - len(shown)
    note = f" ({hidden} internal hidden: --all shows them)" if hidden else ""
    if not shown:
        typer.echo(f"no topics{note}")
        return
    width = max(len("TOPIC"), *(len(r["topic"]) for r in shown))
    typer.echo(f"{'TOPIC':<{width}}  PARTITIONS  ACTIVE")
    for r in shown:
        active = "-" if r["active"] is None else r["active"]
        typer.echo(f"{r['topic']:<{width}}  {r['partitions']:>10}  {active:>6}")
    typer.echo(f"{len(shown)} topic{'s' if len(shown) != 1 else ''}{note}")


async def _topic_rows(bootstrap: Any) -> list[dict[str, Any]]:
    """Every topic the broker names, by name, with its layout's active count where it has one.
    The layout registry is read only if it exists: listing must not create it."""
    from streamkit.kafkaio import KafkaIO
    from streamkit.layout.registry import LAYOUTS_TOPIC, LayoutRegistry

    async with KafkaIO(bootstrap, client_id="streamkit-topics") as io:
        meta = await io.client.fetch_all_metadata()
        names = sorted(meta.topics())
        layouts = {}
        if LAYOUTS_TOPIC in names:
            async with LayoutRegistry(bootstrap, client_id="streamkit-topics", io=io, create_topic=False) as registry:
                await registry.refresh()
                layouts = registry.layouts
    return [
        {
            "topic": name,
            "partitions": len(meta.partitions_for_topic(name) or ()),
            "active": lay.active if (lay := layouts.get(name)) is not None else None,
            "epoch": lay.epoch if lay is not None else None,
            "internal": name.startswith("__") or name in meta.internal_topics,
        }
        for name in names
    ]


@app.command()
def describe(
    topic: str = typer.Argument(...),
    group: list[str] = typer.Option(None, "--group", "-g", help="also show these groups' positions and gates"),
    as_json: bool = typer.Option(False, "--json", help="print the layout as JSON"),
    broker: str | None = BrokerOpt,
) -> None:
    """Show a topic's layout: partitions, modes, epoch, seals, physical vs active."""

    async def go() -> Any:
        async with _coordinator(broker) as co:
            return await co.describe(topic, groups=group or ())

    info = _run(go)
    if info.layout is None:
        if info.physical is None:
            raise CliError(f"topic {topic} does not exist")
        raise CliError(
            f"topic {topic} ({info.physical} partitions) has no streamkit layout; "
            f"adopt it: streamkit topics create {topic} --partitions {info.physical}"
        )
    if as_json:
        import orjson

        typer.echo(orjson.dumps(info.layout.to_dict(), option=orjson.OPT_INDENT_2).decode())
        return
    _print_describe(info, group or [])


def _print_describe(info: Any, groups: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    from streamkit.layout.gating import compute_gate, constraints
    from streamkit.layout.model import ChangeKind, PartitionMode

    lay = info.layout
    con = Console(width=None if Console().is_terminal else 200)
    pend = lay.pending
    state = f"[yellow]{pend.kind.value} to epoch {pend.epoch} ANNOUNCED, not sealed[/yellow]" if pend else "settled"
    broker_note = "" if info.physical == lay.physical else f" (broker has {info.physical})"
    con.print(
        f"[bold]{lay.topic}[/bold]  epoch {lay.epoch} ({state})  n0 {lay.n0}  active {lay.active}  "
        f"physical {lay.physical}{broker_note}  ordered delivery {'on' if lay.ordered_delivery else 'off'}"
    )
    pending: dict[int, list[str]] = {}
    passed: dict[int, list[str]] = {}
    for c in constraints(lay):
        if c.need == 0:
            continue  # nothing to wait for (empty, or given up)
        need = "?" if c.need is None else c.need
        where = "" if c.kind == ChangeKind.EXPAND else f">={c.from_offset} "
        note = f"{where}after p{c.blocker}@{need} (e{c.epoch})"
        # passed: every group named has consumed the blocker to its seal (unknown without one)
        done = bool(groups) and all(c.blocker_passed(info.group_positions.get(g, {})) for g in groups)
        (passed if done else pending).setdefault(c.partition, []).append(note)
    t = Table(show_header=True, header_style="bold")
    for col in ("partition", "mode", "hw", "start"):
        t.add_column(col, justify="right" if col != "mode" else "left")
    gates = {}
    for g in groups:
        t.add_column(f"{g}", justify="right")
        gates[g] = compute_gate(lay, lay.readable, info.group_positions.get(g, {}))
    if groups:
        t.add_column("gates pending")
        t.add_column("gates passed")
    else:
        t.add_column("gates (pass --group G to see which are passed)")
    style = {PartitionMode.READ_WRITE: "green", PartitionMode.READ_ONLY: "yellow", PartitionMode.NONE: "dim"}
    for p in range(max(lay.physical, info.physical or 0)):
        m = lay.mode(p)
        extra = ""
        if m == PartitionMode.READ_ONLY:
            dl = lay.drain_deadline_ms(p)
            if dl:
                extra = f" until {time.strftime('%H:%M:%S', time.localtime(dl / 1000))}"
        row = [
            str(p),
            f"[{style[m]}]{m.label}{extra}[/{style[m]}]",
            str(info.high_watermarks.get(p, "-")),
            str(lay.base_offset(p)),
        ]
        for g in groups:
            pos = info.group_positions.get(g, {}).get(p)
            gate = gates[g].gates.get(p)
            held = gate.limit if gate is not None and not gate.skip else None
            row.append(
                ("-" if pos is None else str(pos)) + (f" [red](held at {held})[/red]" if held is not None else "")
            )
        row.append("; ".join(pending.get(p, [])[-2:]))
        if groups:
            row.append("; ".join(passed.get(p, [])[-2:]))
        t.add_row(*row)
    con.print(t)
    ends = [f"-p {lay.topic}:{p}={info.high_watermarks[p]}" for p in lay.readable if p in info.high_watermarks]
    con.print("high watermarks as backfill positions:", " ".join(ends), soft_wrap=True, highlight=False)
    s = Table(title="changes", show_header=True, header_style="bold")
    for col in ("epoch", "change", "active", "partitions", "seal offsets", "fenced", "at"):
        s.add_column(col)
    for x in lay.seals:
        offs = "announced" if not x.sealed else " ".join(f"{p}:{o}" for p, o in (x.seal_offsets or ())) or "-"
        if len(offs) > 60:
            offs = offs[:57] + "..."
        s.add_row(
            str(x.epoch),
            x.kind.value,
            f"{x.old_active}->{x.new_active}",
            ",".join(map(str, x.partitions)) or "-",
            offs,
            ", ".join(x.fenced) or "-",
            time.strftime("%m-%d %H:%M:%S", time.localtime(x.ts_ms / 1000)) if x.ts_ms else "-",
        )
    con.print(s)
