"""The harness's report: one table of figures per contender, then the same-run ratios;
for contenders run more than once, their medians and the ratios of the medians."""

from __future__ import annotations

import statistics
from typing import Any


def _fmt_rate(v: float | None) -> str:
    return f"{v:,.0f}" if v else "-"


def _fmt_ratio(x: float) -> str:
    if x >= 10:
        return f"{x:,.0f}x"
    if x >= 1:
        return f"{x:.2f}x"
    return f"{x:.2g}x"


CHECKPOINT_S = 2.0
"""How often streamkit and the hand-written durable jobs checkpoint (``commit_interval``)."""
SHORT_WINDOW_S = 3 * CHECKPOINT_S
"""A steady window shorter than this holds fewer than three checkpoints of a durable job."""


def steady_seconds(row: dict[str, Any]) -> float | None:
    """The row's steady window: from its first record to its last (None: not measured)."""
    result = row.get("result") or {}
    first, last = result.get("first_record_at"), result.get("last_record_at")
    return last - first if first and last and last > first else None


def _label(row: dict[str, Any]) -> str:
    """A row's contender, with its run number from its second run on (``--repeat``)."""
    run = row.get("run", 1)
    return row["contender"] if run == 1 else f"{row['contender']} #{run}"


def print_report(rows: list[dict[str, Any]], header: str, console) -> None:
    from rich.table import Table

    table = Table(title=header, title_justify="left")
    for col, justify in [
        ("contender", "left"),
        ("records", "right"),
        ("rec/s steady", "right"),
        ("steady s", "right"),
        ("rec/s from start", "right"),
        ("startup s", "right"),
        ("CPU s", "right"),
        ("CPU µs/rec", "right"),
        ("peak RSS MB", "right"),
        ("broker CPU s", "right"),
        ("load", "right"),
        ("check", "left"),
        ("status", "left"),
    ]:
        table.add_column(col, justify=justify)
    for r in rows:
        if r["status"] == "skipped" and "cpu_s" not in r:
            table.add_row(_label(r), "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "skipped")
            continue
        result = r.get("result") or {}
        status = r["status"]
        table.add_row(
            _label(r),
            f"{result.get('records', 0):,}",
            _fmt_rate(r.get("steady_rps")),
            f"{window:.1f}" if (window := steady_seconds(r)) is not None else "-",
            _fmt_rate(r.get("from_start_rps")),
            f"{r['startup_s']:.2f}" if r.get("startup_s") is not None else "-",
            f"{r['cpu_s']:.2f}",
            f"{r['cpu_us_per_record']:.2f}" if r.get("cpu_us_per_record") else "-",
            f"{r['peak_rss_mb']:.0f}",
            f"{r['broker_cpu_s']:.2f}" if r.get("broker_cpu_s") is not None else "-",
            f"{r['load_avg_1m_before']:.1f}",
            "ok" if r.get("check") == "ok" else ("mismatch" if str(r.get("check")).startswith("MISMATCH") else "n/a"),
            status,
        )
    console.print(table)
    short = [_label(r) for r in rows if (w := steady_seconds(r)) is not None and w < SHORT_WINDOW_S]
    if short:
        console.print(
            f"  steady windows under {SHORT_WINDOW_S:.0f} s ({', '.join(short)}) hold fewer than three checkpoints "
            f"of a job that checkpoints every {CHECKPOINT_S:.0f} s: its last one, and most of its cost, fall "
            "outside; give --records more for a durable job's steady rate"
        )
    for r in rows:
        if r["status"] != "ok" or str(r.get("check", "")).startswith("MISMATCH"):
            detail = r.get("reason") or r.get("check")
            if str(r.get("check", "")).startswith("MISMATCH") and r.get("reason"):
                detail = f"{r['reason']}; {r['check']}"
            console.print(f"  {_label(r)}: {r['status']}: {detail}")

    measured = [r for r in rows if r.get("steady_rps") and r["status"] in ("ok", "wrong")]
    if len(measured) < 2:
        return
    for metric, label in [("steady_rps", "steady"), ("from_start_rps", "from process start")]:
        ratios = Table(
            title=f"ratios, records/s {label}: row / column (>1: the row is faster)",
            title_justify="left",
        )
        ratios.add_column("")
        for c in measured:
            ratios.add_column(f"vs {_label(c)}", justify="right")
        for r in measured:
            cells = []
            for c in measured:
                a, b = r.get(metric), c.get(metric)
                cells.append("-" if r is c or not a or not b else _fmt_ratio(a / b))
            ratios.add_row(_label(r), *cells)
        console.print(ratios)


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per contender measured more than once (in first-run order): its correct runs, and the
    median, lowest and highest of their steady records/s (a run whose totals were wrong does
    not count). On a shared 2-core machine one run of the same code was up to 1.65x faster
    than the next; a goal stated as a ratio is judged on the medians."""
    runs: dict[str, list[float]] = {}
    for r in rows:
        if r.get("steady_rps") and r["status"] == "ok":
            runs.setdefault(r["contender"], []).append(r["steady_rps"])
    return [
        {"contender": name, "runs": len(v), "median": statistics.median(v), "low": min(v), "high": max(v)}
        for name, v in runs.items()
        if len(v) > 1
    ]


def print_medians(summary: list[dict[str, Any]], console) -> None:
    """The medians of the repeated contenders, and the ratios of the medians."""
    from rich.table import Table

    if not summary:
        return
    table = Table(
        title="medians over the repeated runs, records/s steady; ratios of the medians: row / column",
        title_justify="left",
    )
    for col in ("contender", "runs", "median", "low", "high"):
        table.add_column(col, justify="left" if col == "contender" else "right")
    for c in summary:
        table.add_column(f"vs {c['contender']}", justify="right")
    for r in summary:
        cells = ["-" if r is c else _fmt_ratio(r["median"] / c["median"]) for c in summary]
        table.add_row(
            r["contender"], str(r["runs"]), _fmt_rate(r["median"]), _fmt_rate(r["low"]), _fmt_rate(r["high"]), *cells
        )
    console.print(table)
