"""What `streamkit status` shows of the autoscaler: who decides under which bounds, the
inputs and decision of its newest look, and its recent scales and refusals (the view
``streamkit.autoscale.journal.autoscale_view`` builds from its journal)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.console import RenderableType
from rich.markup import escape
from rich.table import Table

from streamkit.autoscale.policy import figures_text

__all__ = ["autoscale_lines", "decisions_table", "inputs_line"]


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def inputs_line(inputs: Mapping[str, Any]) -> str:
    """The figures a decision used, in words, e.g. "lag 1,200 records (2.5 s), input 900/s,
    applied 850/s, busy 0.80, checkpointing 0.02, 2 workers, 2 processors"."""
    parts = [f"lag {inputs['lag']:,} records ({inputs['lag_seconds']:.1f} s)"]
    for name, label in (("input_rate", "input"), ("applied_rate", "applied")):
        if name in inputs:
            parts.append(f"{label} {inputs[name]:,.0f}/s")
    for name in ("busy", "checkpointing"):
        if name in inputs:
            parts.append(f"{name} {inputs[name]:.2f}")
    parts.append(f"{inputs['workers']} workers, {inputs['processors']} processors")
    if inputs.get("unsettled"):
        parts.append("not settled: " + "; ".join(inputs["unsettled"]))
    return ", ".join(parts)


def decisions_table(decisions: list[Mapping[str, Any]]) -> Table:
    """The recent scales and refusals, oldest first."""
    table = Table(title="autoscaler decisions (last 10 minutes: scales and refusals)")
    table.add_column("at")
    table.add_column("action")
    table.add_column("workers", justify="right")
    table.add_column("processors", justify="right")
    table.add_column("why", overflow="fold")
    for d in decisions:
        action = "[bold red]refused[/]" if d["action"] == "refused" else d["action"]
        why = escape(d["why"]) + (f" ({escape(figures_text(d['figures']))})" if d.get("figures") else "")
        table.add_row(_clock(d["at"]), action, str(d.get("workers", "-")), str(d.get("processors", "-")), why)
    return table


def autoscale_lines(shown: Mapping[str, Any]) -> list[RenderableType]:
    """The autoscaler's part of status (``StatusView.autoscale``, not None)."""
    c = shown["controller"]
    how = "local workers" if c.get("workers") == "local" else "workers by gauge"
    bounds = f"{how} {c.get('min', '?')}..{c.get('max', '?')}, target utilization {c.get('target_utilization', '?')}"
    who = f"on {escape(str(c.get('host', '?')))} (pid {c.get('pid', '?')})"
    dry = ", dry run (decides, does not act)" if c.get("dry_run") else ""
    if shown["running"]:
        head = f"autoscaler: {bounds}{dry}, {who}, last look {_clock(shown['at'])}"
    else:
        head = f"autoscaler: [bold yellow]not running[/] (its last look {_clock(shown['at'])}, {who}; {bounds})"
    out: list[RenderableType] = [head, f"  inputs: {escape(inputs_line(shown['inputs']))}"]
    d = shown["decision"]
    if d is not None:
        now = f"{d['action']}: {d['workers']} workers, {d['processors']} processors: {d['why']}"
        out.append(f"  decision: {escape(now)}")
    else:
        out.append("  decision: none yet (rates need a window of looks)")
    if shown["decisions"]:
        out.append(decisions_table(shown["decisions"]))
    return out
