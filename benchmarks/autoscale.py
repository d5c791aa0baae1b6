"""Benchmark: a step load under `streamkit autoscale` against the same job at fixed sizes.

    python -m benchmarks.autoscale [--low 200] [--high 1000] [--before 15] [--during 45]
                                   [--after 75] [--max 4] [--repeat 1] [--chart .bench/autoscale.png]

The job (`benchmarks/autoscale_app.py`) counts per key and waits about 1 ms per record (an
I/O-bound handler: a worker process applies under 1,000 records/s, so capacity grows with
processes even on two cores). Its input topic has ``--max`` partitions and the job starts
with one processor. This process writes ``--low`` records/s for ``--before`` seconds,
``--high`` for ``--during``, then ``--low`` for ``--after``, the same schedule for each of:

- ``autoscale``: `streamkit autoscale --workers local --min 1 --max M` starts the workers
  and scales them and the processors as it decides;
- ``min``: one worker, one processor, all along;
- ``max``: M workers and M processors (scaled before the load starts), all along.

Looked at every second: the lag (records written and not committed), the live workers and
the processors. Printed per contender (medians over ``--repeat`` interleaved runs): the peak
lag, the time from the step up until the lag is back under ``--lag-target`` for good, the
seconds until the job caught up once the input stopped, the worker process-seconds used over
the schedule, and the autoscaler's scale operations; then the autoscaler's ratios against the
two fixed sizes measured in the same run. The chart (PNG): lag and workers over time, one
line per contender, the input rate behind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
APP = "benchmarks.autoscale_app:app"
CONTENDERS = ("autoscale", "min", "max")


@dataclass
class Run:
    """One contender's run: what was seen every second, and the figures from it."""

    contender: str
    t: list[float] = field(default_factory=list)
    """Seconds since the load started."""
    lag: list[int] = field(default_factory=list)
    workers: list[int] = field(default_factory=list)
    processors: list[int] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)
    """The input rate the schedule asked for."""
    drained_after: float = 0.0
    """Seconds from the input's end until the job had applied it all."""
    scales: int = 0

    def peak_lag(self) -> int:
        return max(self.lag, default=0)

    def recovered_after(self, high_from: float, target: int) -> float:
        """Seconds from the step up until the lag is under ``target`` for good (0: never above)."""
        above = [t for t, lag in zip(self.t, self.lag, strict=True) if lag >= target and t >= high_from]
        return max(above) - high_from if above else 0.0

    def process_seconds(self) -> float:
        """Worker processes alive, integrated over the schedule."""
        return sum(w * (b - a) for a, b, w in zip(self.t, self.t[1:], self.workers, strict=False))


def schedule(a: argparse.Namespace, t: float) -> float:
    return a.high if a.before <= t < a.before + a.during else a.low


async def produce(a: argparse.Namespace, bootstrap: str, topic: str, started: float) -> int:
    """The step load: ``schedule`` records/s until its end; returns the records sent."""
    from streamkit.producer import Producer, ProducerConfig

    end = a.before + a.during + a.after
    async with Producer(bootstrap, client_id="autoscale-bench", config=ProducerConfig(linger_ms=5)) as p:
        n, owed = 0, 0.0
        last = time.monotonic()
        while (t := time.monotonic() - started) < end:
            now = time.monotonic()
            owed += schedule(a, t) * (now - last)
            last = now
            while owed >= 1:
                await p.send(topic, f"k{n % a.keys}", {"seq": n})
                n, owed = n + 1, owed - 1
            await asyncio.sleep(0.01)
        await p.flush()
    return n


class Cluster:
    """The job's processes for one run, and looks at it through the broker."""

    def __init__(self, a: argparse.Namespace, bootstrap: str, work: Path, contender: str) -> None:
        tag = uuid.uuid4().hex[:8]
        self.a, self.bootstrap, self.work, self.contender = a, bootstrap, work / contender / tag, contender
        self.work.mkdir(parents=True)
        self.app, self.topic, self.out = f"autoscale-{tag}", f"autoscale-in-{tag}", f"autoscale-out-{tag}"
        self.env = dict(os.environ, SK_BENCH_APP=self.app, SK_BENCH_TOPIC=self.topic, SK_BENCH_OUT=self.out,
                        STREAMKIT_BROKER=bootstrap, STREAMKIT_STATE_DIR=str(self.work / "state"),
                        STREAMKIT_PROCESSORS="1", STREAMKIT_SESSION_TIMEOUT_MS="6000",
                        STREAMKIT_HEARTBEAT_INTERVAL_MS="600", PYTHONPATH=str(ROOT))  # fmt: skip
        self.procs: list[subprocess.Popen[bytes]] = []

    def run(self, *args: str, log: str | None = None) -> subprocess.Popen[bytes]:
        out = open(self.work / (log or f"p{len(self.procs)}.log"), "wb")
        proc = subprocess.Popen([sys.executable, "-m", "streamkit.cli", *args], cwd=ROOT, env=self.env, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        if self.contender == "autoscale":
            a = self.a
            options = {"--workers": "local", "--min": "1", "--max": str(a.max), "--interval": "1", "--window": "4",
                       "--catch-up": str(a.catch_up), "--stabilization": str(a.stabilization), "--retry-after": "5",
                       "--logs": str(self.work / "workers"), "--record": str(self.work / "history.jsonl")}  # fmt: skip
            self.run("autoscale", APP, *(part for option in options.items() for part in option), log="autoscale.log")
        else:
            for _ in range(1 if self.contender == "min" else self.a.max):
                self.run("worker", APP)

    def scale_to_max(self) -> None:
        done = subprocess.run([sys.executable, "-m", "streamkit.cli", "scale", APP, "--processors", str(self.a.max)],
                              cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=300)  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"scaling the fixed job to {self.a.max} processors failed: {done.stderr}")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()

    def scales(self) -> int:
        history = self.work / "history.jsonl"
        if not history.exists():
            return 0
        lines = [json.loads(line) for line in history.read_text().splitlines() if line.endswith("}")]
        return sum(1 for r in lines if (r.get("decision") or {}).get("action") in ("out", "in"))


async def look(io: Any, c: Cluster, beats: Any) -> tuple[int, int, int]:
    """(lag, live workers, processors) now."""
    from streamkit.runtime.jobmeta import read_job

    parts = range(c.a.max)
    committed = await io.committed(f"streamkit-{c.app}", c.topic, list(parts))
    ends = await io.high_watermarks(c.topic, parts)
    statuses = await beats.read_more(io)
    job = await read_job(io, c.app)
    lag = sum(max(0, ends[p] - committed.get(p, 0)) for p in parts)
    return lag, sum(1 for s in statuses if s.alive and not s.stale), job.p if job is not None else 0


async def one_run(a: argparse.Namespace, bootstrap: str, work: Path, contender: str) -> Run:
    from streamkit.cli.status_view import Heartbeats
    from streamkit.kafkaio import KafkaIO
    from streamkit.layout.protocol import LayoutCoordinator
    from streamkit.runtime.jobmeta import read_job

    c = Cluster(a, bootstrap, work, contender)
    run = Run(contender)
    async with LayoutCoordinator(bootstrap, ack_timeout=5.0) as co:
        await co.create(c.topic, a.max, capacity=a.max)
    async with KafkaIO(bootstrap) as io:
        await io.create_topic(c.out, a.max)
        c.start()
        try:
            deadline = time.monotonic() + 120
            while await read_job(io, c.app) is None:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{contender}: the job did not start within 120 s (logs in {c.work})")
                await asyncio.sleep(0.2)
            if contender == "max":
                await asyncio.to_thread(c.scale_to_max)
            beats = Heartbeats(c.app)
            started = time.monotonic()
            producing = asyncio.create_task(produce(a, bootstrap, c.topic, started))
            while not producing.done():
                lag, workers, processors = await look(io, c, beats)
                t = time.monotonic() - started
                run.t.append(t)
                run.lag.append(lag)
                run.workers.append(workers)
                run.processors.append(processors)
                run.rate.append(schedule(a, t))
                await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started - t)))
            sent, ended = await producing, time.monotonic()
            while (await look(io, c, beats))[0] > 0:
                if time.monotonic() - ended > a.drain_timeout:
                    raise SystemExit(f"{contender}: {sent} records sent, not all applied {a.drain_timeout} s later")
                await asyncio.sleep(0.5)
            run.drained_after = time.monotonic() - ended
        finally:
            c.stop()
    run.scales = c.scales()
    return run


def median(runs: list[Run], figure: Any) -> float:
    return statistics.median(figure(r) for r in runs)


def report(console: Console, a: argparse.Namespace, runs: dict[str, list[Run]]) -> dict[str, dict[str, float]]:
    figures = {
        "peak lag (records)": lambda r: r.peak_lag(),
        f"recovered after (s, lag < {a.lag_target:,})": lambda r: r.recovered_after(a.before, a.lag_target),
        "drained after the input ended (s)": lambda r: r.drained_after,
        "worker process-seconds": lambda r: r.process_seconds(),
        "most workers": lambda r: max(r.workers, default=0),
        "scale operations": lambda r: r.scales,
    }
    table = Table(title=f"step load {a.low} -> {a.high} -> {a.low} records/s ({a.before:g} + {a.during:g} + "
                        f"{a.after:g} s), medians of {a.repeat} run(s)")  # fmt: skip
    table.add_column("figure")
    shown = [c for c in CONTENDERS if runs.get(c)]
    for c in shown:
        table.add_column(c, justify="right")
    out: dict[str, dict[str, float]] = {c: {} for c in shown}
    for name, figure in figures.items():
        row = []
        for c in shown:
            value = median(runs[c], figure)
            out[c][name] = value
            row.append(f"{value:,.1f}" if isinstance(value, float) and not value.is_integer() else f"{value:,.0f}")
        table.add_row(name, *row)
    console.print(table)
    if {"autoscale", "min", "max"} <= set(shown):
        auto, low, high = out["autoscale"], out["min"], out["max"]
        ps = "worker process-seconds"
        console.print(
            f"autoscale used {auto[ps] / high[ps]:.2f}x the process-seconds of max and {auto[ps] / low[ps]:.2f}x "
            f"those of min; its peak lag was {auto['peak lag (records)'] / max(1, low['peak lag (records)']):.2f}x "
            f"min's and {auto['peak lag (records)'] / max(1, high['peak lag (records)']):.2f}x max's"
        )
    return out


def chart(a: argparse.Namespace, runs: dict[str, list[Run]], path: Path) -> None:
    """Lag (top) and workers (bottom) over time, the first run of each contender."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"autoscale": "#1f77b4", "min": "#d62728", "max": "#2ca02c"}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, height_ratios=(3, 2))
    for c, rs in runs.items():
        if rs:
            top.plot(rs[0].t, rs[0].lag, label=c, color=colors[c], linewidth=1.6)
            bottom.step(rs[0].t, rs[0].workers, where="post", label=c, color=colors[c], linewidth=1.6)
    for ax in (top, bottom):
        ax.axvspan(a.before, a.before + a.during, color="#999999", alpha=0.12, linewidth=0)
        ax.grid(alpha=0.3)
    top.axhline(a.lag_target, color="#666666", linestyle="--", linewidth=0.8)
    top.set_ylabel("lag (records)")
    top.set_title(f"step load {a.low} -> {a.high} -> {a.low} records/s (shaded: {a.high}/s), 1 ms per record")
    top.legend(loc="upper right")
    bottom.set_ylabel("worker processes")
    bottom.set_xlabel("seconds since the load started")
    bottom.set_ylim(0, a.max + 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default=None, help="bootstrap address (default: an embedded broker)")
    parser.add_argument("--low", type=int, default=200, help="records/s before and after the step")
    parser.add_argument("--high", type=int, default=1000, help="records/s during the step")
    parser.add_argument("--before", type=float, default=15.0)
    parser.add_argument("--during", type=float, default=45.0)
    parser.add_argument("--after", type=float, default=75.0)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--max", type=int, default=4, help="the autoscaler's --max, the fixed max's workers")
    parser.add_argument("--catch-up", type=float, default=15.0, help="the autoscaler's --catch-up")
    parser.add_argument("--stabilization", type=float, default=20.0, help="the autoscaler's --stabilization")
    parser.add_argument("--lag-target", type=int, default=1000)
    parser.add_argument("--drain-timeout", type=float, default=300.0)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--repeat", type=int, default=1, help="interleaved runs per contender (medians)")
    parser.add_argument("--chart", type=Path, default=ROOT / ".bench" / "autoscale.png")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures and the series here")
    parser.add_argument("--keep", type=Path, default=None, help="keep each run's logs and state under this directory")
    a = parser.parse_args()
    from streamkit.broker import resolve_broker

    console = Console()
    contenders = [c for c in a.contenders.split(",") if c]
    runs: dict[str, list[Run]] = {c: [] for c in contenders}
    with resolve_broker(a.broker) as broker, tempfile.TemporaryDirectory(prefix="sk-autoscale-") as scratch:
        work = a.keep or Path(scratch)
        for i in range(a.repeat):
            for c in contenders:
                console.print(f"run {i + 1}/{a.repeat}: {c}")
                runs[c].append(asyncio.run(one_run(a, broker.bootstrap, work, c)))
    figures = report(console, a, runs)
    chart(a, runs, a.chart)
    console.print(f"chart: {a.chart}")
    if a.json is not None:
        series = {c: [{"t": r.t, "lag": r.lag, "workers": r.workers, "processors": r.processors} for r in rs]
                  for c, rs in runs.items()}  # fmt: skip
        args = {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}
        a.json.write_text(json.dumps({"args": args, "figures": figures, "series": series}, indent=1))


if __name__ == "__main__":
    main()
