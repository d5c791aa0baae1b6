"""Benchmark harness: every contender on the same input, on one broker, one at a time.

    python -m benchmarks.harness [--records N] [--keys K[,K...]] [--partitions P]
        [--contenders raw,streamkit,streamkit-stamped,quix,faust,bytewax,pathway] [--faust-fraction 0.1]
        [--session-timeout-ms 6000] [--bootstrap HOST:PORT] [--producers 1] [--repeat 1]

``--contenders streamkit,streamkit@/path/to/other/checkout`` runs the same contender from
another checkout of the repository too (the code before a change), interleaved with this one.

``--keys 10000,100000,1000000`` sweeps key counts: one shape after the other on the same
broker, a report (records/s, CPU per record, peak RSS, ratios) per shape.

Starts ONE embedded broker (or uses --bootstrap), prepares the input ONCE (see
benchmarks.input; a contender given a fraction of the work gets its own topic holding
the first records of the same input; ``streamkit-stamped`` reads the same records
stamped as streamkit's producer stamps them), then runs each contender as its own process
(protocol: benchmarks/contenders/__init__.py; one named in its ``VENVS``, pathway, runs
with the python of a venv of its own, ``.bench/venv-<name>``, made on first use). Per
contender it measures CPU seconds (user + sys, children included) and peak RSS from
``os.wait4`` (through a small launcher process, see ``benchmarks.launch``), and the broker's CPU
seconds during the run; from the contender's RESULT line it computes records/s from
first to last record (steady) and from process start. Prints a table, the ratios of
every contender against every other, and writes everything as JSON under .bench/.

Figures depend on the machine's load: the harness records the load average before each
contender; compare figures only from quiet runs. Even then, on a shared 2-core machine one
run of the same code was up to 1.65x faster than the next: ``--repeat 5`` runs the
contender list five times over, interleaved, and adds each contender's median and the
ratios of the medians.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

from benchmarks.availability import ROOT, availability
from benchmarks.contenders import INPUTS
from benchmarks.input import InputSpec, expected_check, key_indices, prepare_topic
from benchmarks.launch import Bench, compare_check, run_contender
from benchmarks.report import medians, print_medians, print_report

DEFAULT_CONTENDERS = "raw,streamkit,streamkit-stamped,quix,faust"


def _tansu_version(log_path: Path | None) -> str | None:
    try:
        first = log_path.read_text().splitlines()[0] if log_path else ""
    except (OSError, IndexError):
        return None
    return first.strip() or None


def run_shape(
    bench: Bench,
    spec: InputSpec,
    runnable: list[str],
    fractions: dict[str, float],
    args: argparse.Namespace,
    run_id: str,
    console: Any,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Prepare one shape's input and run every contender on it: the result rows and how
    the input was prepared."""
    bootstrap = bench.bootstrap
    rows: list[dict[str, Any]] = []
    topics: dict[tuple[int, str], str] = {}
    ks = key_indices(spec.records, spec.keys, spec.seed)
    prep = []
    inputs = sorted(
        {(max(1, round(spec.records * fractions[n])), INPUTS.get(n, "plain")) for n in runnable}, reverse=True
    )
    for size, kind in inputs:
        topic = f"bench-{run_id.lower()}-{size}-{kind}-{uuid.uuid4().hex[:6]}"
        written, seconds = prepare_topic(
            bootstrap, topic, spec, size, producers=args.producers, stamped=kind == "stamped"
        )
        topics[size, kind] = topic
        prep.append({"topic": topic, "records": written, "seconds": seconds, "rps": written / seconds})
        console.print(
            f"prepared {written:,} {kind} records, {spec.keys:,} keys, {spec.partitions} partitions "
            f"into {topic} in {seconds:.2f}s ({written / seconds:,.0f} records/s)"
        )
    expected = {size: expected_check(ks, size) for size, _ in inputs}

    runs: dict[str, int] = {}
    for name in runnable:
        runs[name] = runs.get(name, 0) + 1
        size = max(1, round(spec.records * fractions[name]))
        timeout = args.timeout if args.timeout is not None else 120 + size / 1000
        console.print(f"running {name} on {size:,} records ...")
        row = run_contender(
            name,
            bench,
            topic=topics[size, INPUTS.get(name, "plain")],
            records=size,
            partitions=spec.partitions,
            timeout=timeout,
            log_name=f"{name}-{spec.keys}keys" + (f"-{runs[name]}" if runs[name] > 1 else ""),
        )
        row["run"] = runs[name]
        row["fraction"] = fractions[name]
        row["expected_check"] = expected[size]
        compare_check(row, expected[size])
        rows.append(row)
        if row["status"] != "ok":
            console.print(
                f"  {name}: {row['status']}: {row.get('reason', row.get('check'))} (logs: {row.get('stderr_log', '-')})"
            )
        elif row.get("steady_rps"):
            console.print(
                f"  {name}: {row['steady_rps']:,.0f} records/s steady, "
                f"{row.get('from_start_rps', 0):,.0f} from process start"
            )

    return rows, prep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.harness", description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument(
        "--keys", default="10000", help="distinct keys; a comma list (10000,100000,1000000) runs one shape per count"
    )
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument(
        "--contenders", default=DEFAULT_CONTENDERS, help=f"comma list of short names (default {DEFAULT_CONTENDERS})"
    )
    ap.add_argument(
        "--faust-fraction",
        type=float,
        default=0.1,
        help="faust processes this fraction of the records (it is ~300x slower)",
    )
    ap.add_argument("--session-timeout-ms", type=int, default=6000)
    ap.add_argument("--bootstrap", default=None, help="use this broker instead of an embedded one")
    ap.add_argument(
        "--producers",
        type=int,
        default=1,
        help="producer processes for the input (each owns some partitions); 1 is usually fastest on 2 cores",
    )
    ap.add_argument(
        "--timeout", type=float, default=None, help="per-contender timeout in seconds (default 120 + 1 ms per record)"
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the contender list this many times over, interleaved (a,b,a,b): the report adds each "
        "contender's median and the ratios of the medians",
    )
    ap.add_argument("--out", type=Path, default=ROOT / ".bench")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat must be at least 1, got {args.repeat}")

    from rich.console import Console

    from streamkit.broker import EmbeddedBroker, resolve_broker

    console = Console(highlight=False, width=shutil.get_terminal_size((160, 24)).columns)
    names = [n.strip() for n in args.contenders.split(",") if n.strip()]
    fractions = {n: (args.faust_fraction if n == "faust" else 1.0) for n in names}
    try:
        key_counts = [int(k.replace("_", "")) for k in args.keys.split(",") if k.strip()]
    except ValueError:
        ap.error(f"--keys: comma list of key counts, got {args.keys!r}")
    specs = [InputSpec(args.records, k, args.partitions) for k in key_counts]
    run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    logdir = args.out / f"harness-{run_id}"
    logdir.mkdir(parents=True, exist_ok=True)

    skipped: list[dict[str, Any]] = []
    runnable = []
    for name in names:
        reason = availability(name, say=console.print)
        if reason:
            skipped.append({"contender": name, "status": "skipped", "reason": reason})
        else:
            runnable.append(name)
    shapes: list[dict[str, Any]] = []

    report: dict[str, Any] = {
        "run_id": run_id,
        "config": {**vars(args), "out": str(args.out), "seed": specs[0].seed},
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "load_avg_at_start": os.getloadavg(),
        },
    }

    with resolve_broker(args.bootstrap) as broker:
        bench = Bench(broker.bootstrap, broker.pid, args.session_timeout_ms, logdir)
        if isinstance(broker, EmbeddedBroker):
            report["broker"] = {"kind": "embedded", "version": _tansu_version(broker.log_path)}
        else:
            report["broker"] = {"kind": "external", "bootstrap": broker.bootstrap}
        console.print(f"broker {broker.bootstrap} ({report['broker'].get('version') or report['broker']['kind']})")

        for spec in specs:
            rows = [dict(r) for r in skipped]
            ran, prep = run_shape(bench, spec, runnable * args.repeat, fractions, args, run_id, console)
            rows += ran
            rows.sort(key=lambda r: names.index(r["contender"]))
            summary = medians(rows)
            shapes.append({"keys": spec.keys, "results": rows, "preparation": prep, "medians": summary})
            header = (
                f"{spec.records:,} records, {spec.keys:,} keys, {spec.partitions} partitions, "
                f"session timeout {args.session_timeout_ms} ms, {os.cpu_count()} CPUs "
                f"(load at start {report['machine']['load_avg_at_start'][0]:.1f})"
            )
            print_report(rows, header, console)
            print_medians(summary, console)

    report["results"] = shapes[0]["results"] if len(shapes) == 1 else []
    report["shapes"] = shapes
    report["machine"]["load_avg_at_end"] = os.getloadavg()

    path = args.out / f"harness-{run_id}.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    shutil.copyfile(path, args.out / "harness-latest.json")
    console.print(f"results: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    failed = [r for shape in shapes for r in shape["results"] if r["status"] in ("failed", "wrong")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
