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
``os.wait4`` (through a small launcher process, see LAUNCHER), and the broker's CPU
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
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.contenders import INPUTS, REQUIRES, VENVS, checkout_of, module_for
from benchmarks.input import InputSpec, expected_check, key_indices, prepare_topic
from benchmarks.report import medians, print_medians, print_report

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONTENDERS = "raw,streamkit,streamkit-stamped,quix,faust"


# --------------------------------------------------------------------------- availability


def availability(name: str, say: Callable[[str], Any] = print) -> str | None:
    """None if contender ``name`` can run, else the reason it is skipped. A contender
    with a venv of its own gets it made here when missing (``say`` tells so)."""
    module = f"benchmarks.contenders.{module_for(name)}"
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        return f"{module}: {exc}"
    if spec is None:
        return f"no module {module}"
    if name in VENVS:  # its packages are in its own venv, not in this interpreter
        return ensure_venv(name, VENVS[name], say)
    needs = list(REQUIRES.get(name, ()))
    if spec.origin and spec.origin.endswith(".py"):
        # A contender may declare REQUIRES = ("pkg", ...) at module level; read it
        # without importing the module.
        import ast

        try:
            tree = ast.parse(Path(spec.origin).read_text())
            for node in tree.body:
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "REQUIRES" for t in node.targets
                ):
                    needs += list(ast.literal_eval(node.value))
        except (OSError, SyntaxError, ValueError):
            pass
    for package in needs:
        if importlib.util.find_spec(package) is None:
            return f"package {package!r} not installed (pip install -e '.[bench]')"
    return None


def venv_python(name: str) -> Path:
    """The python of contender ``name``'s own venv (see ``VENVS``)."""
    return ROOT / ".bench" / f"venv-{name}" / "bin" / "python"


def ensure_venv(name: str, requirements: tuple[str, ...], say: Callable[[str], Any] = print) -> str | None:
    """Make contender ``name``'s venv and install ``requirements`` into it, unless done
    already (a marker in the venv holds the requirements installed). None when it is
    ready, else the reason it is not; pip's output goes to ``.bench/venv-<name>.log``."""
    python = venv_python(name)
    venv = python.parents[1]
    marker = venv / ".bench-requirements"
    wanted = "\n".join(requirements)
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return None
    log = venv.with_name(venv.name + ".log")
    say(
        f"creating {venv.relative_to(ROOT)} for {name} (pip install {' '.join(requirements)}; "
        f"first use only, about a minute; log: {log.relative_to(ROOT)}) ..."
    )
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [] if python.exists() else [[sys.executable, "-m", "venv", str(venv)]]
    steps.append([str(python), "-m", "pip", "install", "--disable-pip-version-check", *requirements])
    with open(log, "wb") as out:
        for cmd in steps:
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode:
                return f"could not make its venv {venv.relative_to(ROOT)} (log: {log.relative_to(ROOT)})"
    marker.write_text(wanted)
    return None


# --------------------------------------------------------------------------- running


def _cpu_of(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        import psutil

        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except Exception:  # psutil missing or process gone
        return None


# Started fresh (exec) by the harness, it starts the contender and reports the
# contender's rusage. Why not wait4 the contender directly: a child's ru_maxrss starts
# at its parent's RSS high-water mark at fork time (Linux keeps the pre-exec mm's
# high-water in signal->maxrss across exec), so children of the harness (which holds
# the input's key list) would all report the harness's RSS as their peak. The launcher
# is a bare interpreter, smaller than any contender, so max() is the contender's own.
LAUNCHER = """
import json, os, subprocess, sys
usage_path, cmd = sys.argv[1], sys.argv[2:]
proc = subprocess.Popen(cmd)
_, status, ru = os.wait4(proc.pid, 0)
proc.returncode = os.waitstatus_to_exitcode(status)
with open(usage_path, "w") as fh:
    json.dump({"utime": ru.ru_utime, "stime": ru.ru_stime, "maxrss_kb": ru.ru_maxrss,
               "exit_code": proc.returncode}, fh)
sys.exit(proc.returncode if proc.returncode >= 0 else 128 - proc.returncode)
"""


def run_contender(
    name: str,
    *,
    bootstrap: str,
    topic: str,
    records: int,
    partitions: int,
    session_timeout_ms: int,
    timeout: float,
    logdir: Path,
    broker_pid: int | None,
    log_name: str | None = None,
) -> dict[str, Any]:
    """Run one contender process to completion; its measurements and RESULT. ``log_name``:
    what its log files are named after (default: the contender)."""
    module = f"benchmarks.contenders.{module_for(name)}"
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{module_for(name)}-"))
    checkout = checkout_of(name)
    cmd = [
        str(venv_python(name)) if name in VENVS else sys.executable,
        "-m",
        module,
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--records",
        str(records),
        "--partitions",
        str(partitions),
        "--workdir",
        str(workdir),
        "--session-timeout-ms",
        str(session_timeout_ms),
    ]
    base = (log_name or name).replace("/", "_")  # (a NAME@DIR contender: its path)
    out_path, err_path = logdir / f"{base}.stdout", logdir / f"{base}.stderr"
    load_before = os.getloadavg()[0]
    broker_cpu_before = _cpu_of(broker_pid)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PEER_TIMEOUT_S": str(timeout), "BENCH_CONTENDER": name}
    if checkout is not None:  # its streamkit, stores and assignors, and its contender module
        env["PYTHONPATH"] = os.pathsep.join(p for p in (checkout, os.environ.get("PYTHONPATH")) if p)
    usage_path = logdir / f"{base}.rusage.json"
    usage_path.unlink(missing_ok=True)
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        launched = time.time()
        # The launcher gets its own session (process group); the contender stays in it,
        # so a timeout kills both with one killpg.
        proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(usage_path), *cmd],
            cwd=checkout or ROOT,
            stdout=out,
            stderr=err,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout + 30)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        ended = time.time()
    broker_cpu_after = _cpu_of(broker_pid)
    shutil.rmtree(workdir, ignore_errors=True)
    try:
        usage = json.loads(usage_path.read_text())
    except (OSError, ValueError):
        usage = {"utime": 0.0, "stime": 0.0, "maxrss_kb": 0, "exit_code": proc.returncode}

    stdout = out_path.read_text(errors="replace")
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    row: dict[str, Any] = {
        "contender": name,
        "module": module,
        "records_requested": records,
        "topic": topic,
        "exit_code": usage["exit_code"],
        "wall_s": ended - launched,
        "launched_at": launched,
        "cpu_user_s": usage["utime"],
        "cpu_sys_s": usage["stime"],
        "cpu_s": usage["utime"] + usage["stime"],
        "peak_rss_mb": usage["maxrss_kb"] / 1024.0,  # KiB on Linux
        "load_avg_1m_before": load_before,
        "stdout_log": str(out_path),
        "stderr_log": str(err_path),
    }
    if broker_cpu_before is not None and broker_cpu_after is not None:
        row["broker_cpu_s"] = broker_cpu_after - broker_cpu_before
    if timed_out:
        row["status"] = "failed"
        row["reason"] = f"timed out after {timeout:.0f}s"
        return row
    if not lines:
        row["status"] = "failed"
        row["reason"] = _failure_reason(err_path, usage["exit_code"])
        if "ModuleNotFoundError" in row["reason"] or "ImportError" in row["reason"]:
            row["status"] = "skipped"
        return row
    result = json.loads(lines[-1][len("RESULT ") :])
    row["result"] = result
    n = result.get("records") or 0
    first, last, start = (result.get(k) for k in ("first_record_at", "last_record_at", "process_start"))
    if n and first and last and last > first:
        row["steady_rps"] = n / (last - first)
    if n and start and last and last > start:
        row["from_start_rps"] = n / (last - start)
        row["startup_s"] = (first - start) if first else None
    if n:
        row["cpu_us_per_record"] = row["cpu_s"] / n * 1e6
    if result.get("error"):
        row["status"] = "failed"
        row["reason"] = str(result["error"]).splitlines()[0]
    elif n != records:
        row["status"] = "failed"
        row["reason"] = f"processed {n} of {records} records"
    elif usage["exit_code"] != 0:
        row["status"] = "failed"
        row["reason"] = f"exit code {usage['exit_code']}"
    else:
        row["status"] = "ok"
    return row


def _failure_reason(err_path: Path, code: int) -> str:
    lines = [line.strip() for line in err_path.read_text(errors="replace").splitlines() if line.strip()]
    tail = lines[-1] if lines else ""
    return f"no RESULT line (exit code {code}){': ' + tail if tail else ''}"


def compare_check(row: dict[str, Any], expected: dict[str, int]) -> None:
    check = (row.get("result") or {}).get("check")
    if not isinstance(check, dict):
        row["check"] = "n/a"
        return
    mismatches = {k: (check[k], v) for k, v in expected.items() if k in check and check[k] != v}
    if mismatches:
        row["check"] = "MISMATCH " + ", ".join(f"{k}={a} (expected {b})" for k, (a, b) in mismatches.items())
        if row.get("status") == "ok":
            row["status"] = "wrong"
    else:
        row["check"] = "ok" if any(k in check for k in expected) else "n/a"


def _tansu_version(log_path: Path | None) -> str | None:
    try:
        first = log_path.read_text().splitlines()[0] if log_path else ""
    except (OSError, IndexError):
        return None
    return first.strip() or None


# --------------------------------------------------------------------------- main


def run_shape(
    bootstrap: str,
    broker_pid: int | None,
    spec: InputSpec,
    runnable: list[str],
    fractions: dict[str, float],
    args: argparse.Namespace,
    run_id: str,
    logdir: Path,
    console: Any,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Prepare one shape's input and run every contender on it: the result rows and how
    the input was prepared."""
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
            bootstrap=bootstrap,
            topic=topics[size, INPUTS.get(name, "plain")],
            records=size,
            partitions=spec.partitions,
            session_timeout_ms=args.session_timeout_ms,
            timeout=timeout,
            logdir=logdir,
            broker_pid=broker_pid,
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
        broker_pid = broker.pid
        if isinstance(broker, EmbeddedBroker):
            report["broker"] = {"kind": "embedded", "version": _tansu_version(broker.log_path)}
        else:
            report["broker"] = {"kind": "external", "bootstrap": broker.bootstrap}
        console.print(f"broker {broker.bootstrap} ({report['broker'].get('version') or report['broker']['kind']})")

        for spec in specs:
            rows = [dict(r) for r in skipped]
            ran, prep = run_shape(
                broker.bootstrap, broker_pid, spec, runnable * args.repeat, fractions, args, run_id, logdir, console
            )
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
