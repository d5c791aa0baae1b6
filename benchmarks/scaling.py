"""Benchmark: a live 2 -> 3 processor scale-out, then 3 -> 2 back, at a fixed input rate.

    python -m benchmarks.scaling [--rate 4000] [--keys 10000] [--before 20] [--after 20]

Two worker processes run `benchmarks/scaling_app.py` (count per key, one output per
input record) on a 4-partition topic; this process produces at a fixed rate with the
streamkit producer, runs `streamkit scale --processors 3` after `--before` seconds, goes
on for `--after` seconds once the handover is done, then runs `streamkit scale
--processors 2` (the joined processor retires into the one it split from, hosted by the
same worker: a shrink in place) and goes on for `--after` seconds more. Printed, from the
output topic and the workers' logs of the same run:

- output records/s before, during (from the scale command to the handover) and after;
- the joining processor's replay rate (records it rebuilt per second of bootstrap) next
  to the input rate;
- the longest per-key output stall around each handover, growth and shrink: the time
  between a key's consecutive outputs minus the time between their inputs (goal: under
  1 s), and whether the shrink handed over in place;
- the keys that moved (those linear hashing gives the new processor), as a share of all
  keys (one bucket: about 1/p);
- the bootstrap: where it started (the splitting processor's changelog, or the input
  history), its seconds from start to caught up, and the input records it replayed.

``--bootstrap changelog,input`` runs the same job twice in one invocation, with its
changelog on and off, and prints the two bootstraps side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


async def produce(bootstrap: str, topic: str, rate: float, keys: int, stop: asyncio.Event) -> int:
    from streamkit.producer import Producer, ProducerConfig

    async with Producer(bootstrap, client_id="scaling-bench", config=ProducerConfig(linger_ms=5)) as p:
        start, n = time.monotonic(), 0
        while not stop.is_set():
            await p.send(topic, f"k{n % keys}", {"seq": n, "sent": time.time()})
            n += 1
            if n % 50 == 0 and (ahead := n / rate - (time.monotonic() - start)) > 0:
                await asyncio.sleep(ahead)
        await p.flush()
    return n


def stalls(outputs: list[tuple[str, float, float]], window: tuple[float, float]) -> tuple[float, str]:
    """The longest (output gap - input gap) of a key whose second output falls in ``window``."""
    last: dict[str, tuple[float, float]] = {}
    worst, where = 0.0, ""
    for key, sent, at in outputs:
        prev = last.get(key)
        if prev is not None and window[0] <= at <= window[1]:
            stall = (at - prev[1]) - (sent - prev[0])
            if stall > worst:
                worst, where = stall, key
        last[key] = (sent, at)
    return worst, where


async def main(a: argparse.Namespace, mode: str) -> tuple[float, int]:
    """One run, the joining processor bootstrapping from ``mode`` ("changelog" or "input");
    (bootstrap seconds, input records it replayed)."""
    from assignors.linear_hashing import lh_bucket
    from assignors.murmur2 import key_hash
    from streamkit.broker import resolve_broker
    from streamkit.kafkaio import KafkaIO
    from streamkit.runtime.jobmeta import read_job

    console = Console()
    with resolve_broker(a.broker) as broker, tempfile.TemporaryDirectory(prefix="sk-scaling-") as work:
        bootstrap = broker.bootstrap
        tag = uuid.uuid4().hex[:8]
        app, topic, out = f"scaling-{tag}", f"scaling-in-{tag}", f"scaling-out-{tag}"
        env = dict(os.environ, SK_BENCH_APP=app, SK_BENCH_TOPIC=topic, SK_BENCH_OUT=out, STREAMKIT_BROKER=bootstrap,
                   STREAMKIT_STATE_DIR=str(Path(work) / "state"), STREAMKIT_PROCESSORS="2",
                   STREAMKIT_SESSION_TIMEOUT_MS=str(a.session_timeout_ms),
                   STREAMKIT_HEARTBEAT_INTERVAL_MS=str(a.session_timeout_ms // 10), PYTHONPATH=str(ROOT),
                   STREAMKIT_CHANGELOG=str(mode == "changelog").lower())  # fmt: skip
        async with KafkaIO(bootstrap) as io:
            await io.create_topic(topic, 4)
            await io.create_topic(out, 4)
            logs = [Path(work) / f"w{i}.log" for i in range(2)]
            cmd = [sys.executable, "-m", "streamkit.cli", "worker", "benchmarks.scaling_app:app", "--log-level", "INFO"]
            workers = [subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=open(log, "wb")) for log in logs]
            stop = asyncio.Event()
            producer = asyncio.create_task(produce(bootstrap, topic, a.rate, a.keys, stop))
            try:
                await asyncio.sleep(a.before)
                t_scale = time.time()
                scale = await asyncio.to_thread(
                    subprocess.run,
                    [sys.executable, "-m", "streamkit.cli", "scale", "benchmarks.scaling_app:app", "--processors", "3"],
                    cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                )  # fmt: skip
                if scale.returncode != 0:
                    raise SystemExit(f"scale failed: {scale.stderr}")
                t_done = time.time()
                job = await read_job(io, app)
                assert job is not None and job.p == 3
                await asyncio.sleep(a.after)
                t_shrink = time.time()
                back = await asyncio.to_thread(
                    subprocess.run,
                    [sys.executable, "-m", "streamkit.cli", "scale", "benchmarks.scaling_app:app", "--processors", "2",
                     "--wait", "--timeout", "300"],
                    cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                )  # fmt: skip
                if back.returncode != 0:
                    raise SystemExit(f"scale back failed: {back.stdout}{back.stderr}")
                t_shrunk = time.time()
                await asyncio.sleep(a.after)
            finally:
                stop.set()
                sent = await producer
            deadline = time.monotonic() + 120
            while sum((await io.committed(f"streamkit-{app}", topic, range(4))).values()) < sent:
                assert time.monotonic() < deadline, "the job did not catch up"
                await asyncio.sleep(0.5)
            for w in workers:
                w.send_signal(signal.SIGTERM)
            for w in workers:
                w.wait(60)
            records = await io.read_topic(out)
        outputs = sorted(
            ((r.key.decode(), orjson.loads(r.value)["sent"], r.timestamp / 1000) for r in records), key=lambda o: o[2]
        )
        text = "".join(log.read_text() for log in logs)
        if a.logs:
            Path(a.logs).mkdir(parents=True, exist_ok=True)
            for log in logs:
                (Path(a.logs) / f"{mode}-{log.name}").write_text(log.read_text())
        keys = {r.key for r in records if r.key is not None}
        moved, total = sum(1 for k in keys if lh_bucket(key_hash(k), 2, 3) == 2), len(keys)
    shrink = Shrink(t_shrink, t_shrunk, "of retiring processor 2 in place (no rebalance)" in text)
    return report(console, a, outputs, (t_scale, t_done, shrink), text, moved, total, mode)


@dataclass(frozen=True)
class Shrink:
    """When the scale back to 2 started and ended, and whether it handed over in place."""

    started: float
    done: float
    in_place: bool


def report(
    console: Console, a: Any, outputs: list[tuple[str, float, float]], times: tuple[float, float, Shrink], log: str,
    moved: int, total: int, mode: str,
) -> tuple[float, int]:  # fmt: skip
    t_scale, t_done, shrink = times

    def rate(t0: float, t1: float) -> float:
        return sum(1 for _, _, at in outputs if t0 <= at < t1) / max(t1 - t0, 1e-9)

    first, last = outputs[0][2], outputs[-1][2]
    joined = _log_time(log, "joins the job")
    caught = re.search(r"^(\S+ \S+) .*caught up \((\d+) records replayed", log, re.M)
    replay_rate = 0.0
    replayed = int(caught.group(2)) if caught is not None else 0
    if joined is not None and caught is not None:
        replay_rate = replayed / max(_parse(caught.group(1)) - joined, 1e-9)
    seeded = re.search(r"seeded from processor \d+'s changelog: (\d+) keys", log)
    until_caught = _parse(caught.group(1)) - t_scale if caught is not None else 0.0
    worst, key = stalls(outputs, (t_scale, t_done + 5))
    back, back_key = stalls(outputs, (shrink.started, shrink.done + 5))
    table = Table(
        title=f"live scale-out 2 -> 3 processors and back at {a.rate:,.0f} records/s, {a.keys:,} keys, "
        f"session timeout {a.session_timeout_ms} ms, bootstrap from the {mode}"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("output records/s before", f"{rate(first + 2, t_scale):,.0f}")
    table.add_row(
        f"output records/s during ({t_done - t_scale:.1f} s, scale to handover)", f"{rate(t_scale, t_done):,.0f}"
    )
    table.add_row("output records/s after", f"{rate(t_done + 2, shrink.started):,.0f}")
    table.add_row("input records/s (fixed)", f"{a.rate:,.0f}")
    table.add_row("bootstrap replay records/s", f"{replay_rate:,.0f}")
    where = f"processor 0's changelog ({seeded.group(1)} keys)" if seeded else "the input history"
    table.add_row("bootstrap started from", where)
    table.add_row("bootstrap seconds, `scale` to caught up", f"{until_caught:.2f}")
    table.add_row("input records the bootstrap replayed", f"{replayed:,}")
    table.add_row("longest per-key output stall around the handover", f"{worst:.3f} s ({key})")
    table.add_row("keys moved to the new processor", f"{moved:,} of {total:,} ({moved / max(total, 1):.1%})")
    table.add_row(
        f"output records/s during the shrink ({shrink.done - shrink.started:.1f} s, scale to settled)",
        f"{rate(shrink.started, shrink.done):,.0f}",
    )
    table.add_row("output records/s after the shrink", f"{rate(shrink.done + 2, last - 1):,.0f}")
    table.add_row("the shrink's handover", "in place (no rebalance)" if shrink.in_place else "through a rebalance")
    assigned = re.finditer(r"^(\S+ \S+) .*assigned processors", log, re.M)
    after = [m for m in assigned if _parse(m.group(1)) >= shrink.started]
    table.add_row("group rebalances from the shrink on (workers' assignments)", f"{len(after)}")
    handed = _log_time(log, "of retiring processor 2 in place (no rebalance)")
    if handed is not None:
        table.add_row("seconds from `scale` to the shrink's handover", f"{handed - shrink.started:.2f}")
    table.add_row("longest per-key output stall around the shrink's handover", f"{back:.3f} s ({back_key})")
    console.print(table)
    console.print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return until_caught, replayed


async def run_modes(a: argparse.Namespace) -> None:
    results = {mode: await main(a, mode) for mode in a.bootstrap.split(",")}
    if {"changelog", "input"} <= set(results):
        (c_s, c_n), (i_s, i_n) = results["changelog"], results["input"]
        Console().print(
            f"bootstrap from the changelog: {c_s:.2f} s, {c_n:,} input records replayed; from the input: "
            f"{i_s:.2f} s, {i_n:,} replayed; changelog / input: {c_s / max(i_s, 1e-9):.2f}x the time"
        )


def _parse(stamp: str) -> float:
    return time.mktime(time.strptime(stamp.split(",")[0], "%Y-%m-%d %H:%M:%S")) + int(stamp.split(",")[1]) / 1000


def _log_time(log: str, marker: str) -> float | None:
    found = re.search(rf"^(\S+ \S+) .*{re.escape(marker)}", log, re.M)
    return _parse(found.group(1)) if found else None


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", default=None, help="bootstrap address (default: an embedded broker)")
    ap.add_argument("--rate", type=float, default=4000.0, help="input records/s")
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--before", type=float, default=20.0, help="seconds of steady load before the scale-out")
    ap.add_argument("--after", type=float, default=20.0, help="seconds of load after the handover")
    ap.add_argument(
        "--session-timeout-ms", type=int, default=6000,
        help="the workers' session timeout (the test broker holds a join for half of it: the handover's pause)",
    )  # fmt: skip
    ap.add_argument(
        "--bootstrap", default="changelog",
        help="where the joining processor starts: changelog, input (the job without a changelog), or both: "
        "changelog,input",
    )  # fmt: skip
    ap.add_argument("--logs", default=None, help="a directory to keep the workers' logs in")
    asyncio.run(run_modes(ap.parse_args()))
