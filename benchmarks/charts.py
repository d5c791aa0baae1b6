"""Charts and tables of benchmark figures, for the documentation (SVG and Markdown).

    python -m benchmarks.charts --out DIR                       # the figures in benchmarks/results.json
    python -m benchmarks.charts --harness .bench/harness-latest.json --out DIR   # a harness run of yours

The documentation's build (``docs/hooks/charts.py``) draws them from
``benchmarks/results.json``, the figures of recorded runs with their dates, at every build:

- ``throughput``: records/s (first to last record) of streamkit and its peers at 10,000
  and 1,000,000 keys (bars: a run; dots: a second run of the same command, where there is one);
- ``windows``: records/s of each kind of window against the plain job and quixstreams;
- ``failover``: how long a dead worker's keys wait for output, by state size, restored from
  the changelog or promoted from a standby replica (the broker's part, then streamkit's).

``--harness`` draws the throughput chart of a harness run's JSON instead (its first run of
each contender, per key count), to set a run of your own beside the recorded ones.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).with_name("results.json")

LABELS = {
    "raw": "raw aiokafka + orjson (no state)",
    "raw-dict": "raw aiokafka + orjson, state in a dict (nothing persisted)",
    "raw-rocksdb": "raw aiokafka + orjson, state in a dict, persisted by hand (RocksDB + changelog every 2 s)",
    "raw-forked": "raw aiokafka + orjson, state in a dict, persisted by hand in a forked child every 2 s",
    "streamkit": "streamkit",
    "streamkit-stamped": "streamkit (input stamped by its producer)",
    "streamkit-nolog": "streamkit without its changelog",
    "streamkit-nowrite": "streamkit, its stores' writes left out (an upper bound)",
    "streamkit-nostate": "streamkit, no state in its checkpoints (an upper bound)",
    "quix": "quixstreams",
    "faust": "faust",
    "bytewax": "Bytewax 0.21 (stateful_map, recovery on)",
    "pathway": "Pathway 0.33 (groupby().reduce(), persistence on)",
    "streamkit-tumbling": "streamkit, tumbling (1 s)",
    "streamkit-hopping": "streamkit, hopping (10 s by 1 s)",
    "streamkit-session": "streamkit, session (0.5 s gap)",
    "streamkit-count": "streamkit, count (10 records)",
    "quix-hopping": "quixstreams, hopping (10 s by 1 s)",
}
STORES = {"separate": "restored from the changelog", "standby": "promoted from a standby replica"}


def load(path: Path = RESULTS) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def label(contender: str) -> str:
    return LABELS.get(contender, contender)


# -- charts ----------------------------------------------------------------------------------


def _figure(width: float, height: float) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "svg.fonttype": "none",  # text stays text: searchable, scales, uses the page's fonts
            "svg.hashsalt": "streamkit",  # the same figures give the same file
            "font.size": 10,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    )
    return plt.subplots(figsize=(width, height))


def _svg(fig: Any) -> str:
    import matplotlib.pyplot as plt

    out = io.StringIO()
    fig.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return out.getvalue()


def _first_runs(shape: dict[str, Any]) -> dict[str, float]:
    """Contender -> records/s steady of its first correct run in a shape (harness rows)."""
    found: dict[str, float] = {}
    for row in shape["results"]:
        if row.get("status", "ok") == "ok" and row.get("steady_rps") and row["contender"] not in found:
            found[row["contender"]] = float(row["steady_rps"])
    return found


def throughput_svg(runs: list[dict[str, Any]]) -> str:
    """Grouped bars: contenders, per key count, of the first run; dots: the later runs."""
    first, later = runs[0], runs[1:]
    shapes = [(shape["keys"], _first_runs(shape)) for shape in first["shapes"]]
    contenders = list(dict.fromkeys(c for _, rates in shapes for c in rates))
    fig, ax = _figure(8, 4.2)
    width = 0.8 / len(shapes)
    for i, (keys, rates) in enumerate(shapes):
        xs = [j + (i - (len(shapes) - 1) / 2) * width for j in range(len(contenders))]
        bars = ax.bar(xs, [rates.get(c, 0) / 1000 for c in contenders], width * 0.95, label=f"{keys:,} keys")
        for x, c, bar in zip(xs, contenders, bars):
            for run in later:
                for shape in run["shapes"]:
                    if shape["keys"] == keys and c in (again := _first_runs(shape)):
                        ax.plot(x, again[c] / 1000, "o", color="black", markersize=4, zorder=3)
            ax.annotate(f"{rates.get(c, 0) / 1000:,.0f}k", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")  # fmt: skip
    ax.set_xticks(range(len(contenders)), [_short(c) for c in contenders])
    ax.set_ylabel("thousand records/s (first to last record)")
    when = first.get("date", "a harness run")
    ax.set_title(f"Count + sum per key, {first.get('records', 0):,} records ({when})", fontsize=10)
    if later:
        ax.plot([], [], "o", color="black", markersize=4, label="a second run")
    ax.legend(frameon=False)
    return _svg(fig)


def _short(contender: str) -> str:
    return {"raw": "raw aiokafka\n(no state)", "quix": "quixstreams", "bytewax": "Bytewax", "pathway": "Pathway"}.get(
        contender, contender
    )


def windows_svg(runs: list[dict[str, Any]]) -> str:
    """Horizontal bars: each window kind's records/s in the first run; dots: the later runs."""
    rates = [_first_runs(run["shapes"][0]) for run in runs]
    contenders = list(rates[0])
    fig, ax = _figure(8, 3.8)
    ys = list(range(len(contenders)))[::-1]
    colors = ["#3f51b5" if c.startswith("streamkit") else "#9e9e9e" for c in contenders]
    ax.barh(ys, [rates[0][c] / 1000 for c in contenders], color=colors, height=0.7, label=runs[0]["date"])
    for y, c in zip(ys, contenders):
        ax.annotate(f"{rates[0][c] / 1000:,.0f}k", (rates[0][c] / 1000, y), va="center", fontsize=8,
                    xytext=(4, 0), textcoords="offset points")  # fmt: skip
        for again in rates[1:]:
            if c in again:
                ax.plot(again[c] / 1000, y, "o", color="black", markersize=4, zorder=3)
    if len(rates) > 1:
        ax.plot([], [], "o", color="black", markersize=4, label="a second run")
    ax.set_yticks(ys, [label(c) for c in contenders])
    ax.set_xlabel("thousand records/s (first to last record)")
    shape = runs[0]
    ax.set_title(
        f"Windows: sum per key and window, {shape['records']:,} records, {shape['shapes'][0]['keys']:,} keys "
        f"({shape['date']})",
        fontsize=10,
    )
    ax.legend(frameon=False, loc="lower right")
    return _svg(fig)


def failover_svg(failover: dict[str, Any]) -> str:
    """Stacked bars per state size and way of keeping stores: the broker's part (failure
    detection and the group's rejoin, up to the survivors' assignment), then streamkit's."""
    runs = failover["runs"]
    fig, ax = _figure(8, 3.2)
    names = [f"{r['keys']:,} keys, {STORES.get(r['stores'], r['stores'])}" for r in runs]
    ys = list(range(len(runs)))[::-1]
    broker = [r["stall_s"] - r["after_assignment_s"] for r in runs]
    after = [r["after_assignment_s"] for r in runs]
    ax.barh(ys, broker, color="#9e9e9e", height=0.6, label="until the new assignment (the broker's part)")
    ax.barh(ys, after, left=broker, color="#3f51b5", height=0.6, label="assignment to first output (streamkit's)")
    for y, r in zip(ys, runs):
        ax.annotate(f"{r['stall_s']:.2f} s ({r['after_assignment_s']:.2f} s after the assignment)", (r["stall_s"], y),
                    va="center", fontsize=8, xytext=(4, 0), textcoords="offset points")  # fmt: skip
    ax.set_yticks(ys, names)
    ax.set_xlim(0, max(r["stall_s"] for r in runs) * 1.6)
    ax.set_xlabel("seconds from the SIGKILL to the dead worker's keys' next output")
    ax.set_title(f"A worker killed: its keys' output stall ({failover['date']})", fontsize=10)
    ax.legend(frameon=False, loc="lower right", fontsize=8)
    return _svg(fig)


def charts(results: dict[str, Any]) -> dict[str, str]:
    """Chart name -> SVG text."""
    return {
        "throughput": throughput_svg(results["throughput"]),
        "windows": windows_svg(results["windows"]),
        "failover": failover_svg(results["failover"]),
    }


# -- tables ----------------------------------------------------------------------------------


def _measured(run: dict[str, Any]) -> str:
    if "command" not in run:
        return ""
    note = f" ({run['note']})" if "note" in run else ""
    return f"Measured on {run['date']} by `{run['command']}`{note}:"


def throughput_table(run: dict[str, Any]) -> str:
    """Markdown tables of a harness-shaped run, one per key count: each contender's
    records/s steady and from process start, CPU µs per record and peak RSS."""
    out = [_measured(run)]
    for shape in run["shapes"]:
        out += [
            "",
            f"**{shape['keys']:,} keys**",
            "",
            "| contender | records/s steady | from process start | CPU µs/record | peak RSS MB |",
            "|---|---|---|---|---|",
        ]
        for row in shape["results"]:
            out.append(
                f"| {label(row['contender'])} | {row['steady_rps']:,.0f} | {row['from_start_rps']:,.0f} | "
                f"{row['cpu_us_per_record']:.2f} | {row['peak_rss_mb']:,.0f} |"
            )
    return "\n".join(out)


def windows_table(runs: list[dict[str, Any]]) -> str:
    rates = [_first_runs(run["shapes"][0]) for run in runs]
    head = ["contender", *[f"records/s, run {i + 1} ({run['date']})" for i, run in enumerate(runs)]]
    lines = [_measured(runs[0]), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in rates[0]:
        lines.append(f"| {label(c)} | " + " | ".join(f"{r[c]:,.0f}" if c in r else "-" for r in rates) + " |")
    return "\n".join(lines)


def failover_table(failover: dict[str, Any]) -> str:
    lines = [
        _measured(failover),
        "",
        "| keys of state | the dead worker's processors | SIGKILL to output | of which after the new assignment |",
        "|---|---|---|---|",
    ]
    for r in failover["runs"]:
        lines.append(
            f"| {r['keys']:,} | {STORES.get(r['stores'], r['stores'])} | {r['stall_s']:.2f} s | "
            f"{r['after_assignment_s']:.2f} s |"
        )
    return "\n".join(lines)


def tables(results: dict[str, Any]) -> dict[str, str]:
    """Table name -> Markdown."""
    return {
        "throughput": throughput_table(results["throughput"][0]),
        "windows": windows_table(results["windows"]),
        "failover": failover_table(results["failover"]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.charts", description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS, help="recorded figures (default: %(default)s)")
    ap.add_argument("--harness", type=Path, default=None, help="draw the throughput chart of this harness JSON")
    ap.add_argument("--out", type=Path, required=True, help="directory to write the SVG files to")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.harness is not None:
        report = json.loads(args.harness.read_text())
        run = {"date": report.get("run_id", "a harness run"), "records": report["config"]["records"],
               "shapes": report["shapes"]}  # fmt: skip
        drawn = {"throughput": throughput_svg([run])}
    else:
        drawn = charts(load(args.results))
    for name, svg in drawn.items():
        (args.out / f"{name}.svg").write_text(svg)
        print(args.out / f"{name}.svg")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
