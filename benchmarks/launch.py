"""One contender process, run to completion and measured.

The harness (``benchmarks.harness``) runs each contender as its own process through a
small launcher (``LAUNCHER``) and reads back its CPU seconds and peak RSS from
``os.wait4``, the broker's CPU seconds during the run, and the contender's RESULT line
(protocol: ``benchmarks/contenders/__init__.py``), from which it computes records/s.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.availability import ROOT, venv_python
from benchmarks.contenders import VENVS, checkout_of, module_for


@dataclass(frozen=True)
class Bench:
    """Where every contender of a harness command runs: the broker (its process, when
    known, for the broker's CPU seconds during each run), the consumer group's session
    timeout, and the folder of the contenders' logs."""

    bootstrap: str
    broker_pid: int | None
    session_timeout_ms: int
    logdir: Path


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
    bench: Bench,
    *,
    topic: str,
    records: int,
    partitions: int,
    timeout: float,
    log_name: str | None = None,
) -> dict[str, Any]:
    """Run one contender process to completion; its measurements and RESULT. ``log_name``:
    what its log files are named after (default: the contender)."""
    logdir, broker_pid = bench.logdir, bench.broker_pid
    module = f"benchmarks.contenders.{module_for(name)}"
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{module_for(name)}-"))
    checkout = checkout_of(name)
    cmd = [
        str(venv_python(name)) if name in VENVS else sys.executable,
        "-m",
        module,
        "--bootstrap",
        bench.bootstrap,
        "--topic",
        topic,
        "--records",
        str(records),
        "--partitions",
        str(partitions),
        "--workdir",
        str(workdir),
        "--session-timeout-ms",
        str(bench.session_timeout_ms),
    ]
    base = (log_name or name).replace("/", "_")  # (a NAME@DIR contender: its path)
    out_path, err_path = logdir / f"{base}.stdout", logdir / f"{base}.stderr"
    load_before = os.getloadavg()[0]
    broker_cpu_before = _cpu_of(broker_pid)
    env = contender_env(name, timeout)
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


def contender_env(name: str, timeout: float) -> dict[str, str]:
    """The environment of contender ``name``'s process: its variant in ``BENCH_CONTENDER``
    (of ``NAME@DIR``, NAME: the variant, wherever it runs from)."""
    variant = name.partition("@")[0]
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PEER_TIMEOUT_S": str(timeout), "BENCH_CONTENDER": variant}


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
