"""Benchmark: what a worker's death costs the keys it hosted, by state size.

    python -m benchmarks.failover [--keys 100000,1000000] [--stores separate,standby,shared] [--rate 2000]

Three worker processes run `benchmarks/scaling_app.py` (count per key, one output per
input record carrying its send time) as a job of six processors on a 6-partition topic.
First every key gets a record (the state: ``--keys`` keys, in the stores and the
changelog); then this process produces at a fixed rate over all keys, SIGKILLs the
worker hosting processor 0 after ``--before`` seconds, and goes on for ``--after``.
Printed, per state size and way of keeping stores:

- ``separate``: each worker has a state directory of its own (another machine's disk):
  the dead worker's processors are restored from their changelog on the workers that
  take them, then read the input from the changelog's positions;
- ``standby``: separate state directories and ``standby_replicas=1``: each processor's
  store has a warm copy on another worker, kept from the changelog; the dead worker's
  processors go to the workers holding their copies (the rest of the changelog, then
  the input from the last marker's positions);
- ``shared``: the workers share one state directory (one machine): the stores of the
  dead worker's processors are there already, caught up to their last checkpoint (the
  input from the checkpoint's positions).

For the keys of the dead worker's processors (those with a record after the kill): the
time from the kill to their first output (median, 99th percentile, worst), next to the
session timeout (the broker's failure detection), and the restore seconds the log gave.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from benchmarks.scaling import produce

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = 6
WORKERS = 3


async def _wait_committed(io: Any, group: str, topic: str, at_least: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while sum((await io.committed(group, topic, range(PARTITIONS))).values()) < at_least:
        assert time.monotonic() < deadline, f"the job did not reach {at_least:,} records in {timeout:.0f} s"
        await asyncio.sleep(0.5)


async def _wait_for_logs(logs: list[Path], text: str, count: int, timeout: float) -> None:
    """Until the workers' logs say ``text`` followed by a processor id for ``count`` ids."""
    deadline = time.monotonic() + timeout
    pattern = re.compile(re.escape(text) + r" (\d+)")
    while len({m for log in logs for m in pattern.findall(log.read_text(errors="replace"))}) < count:
        assert time.monotonic() < deadline, f"not {count} x {text!r} in the logs after {timeout:.0f} s"
        await asyncio.sleep(0.5)


def _assigned_after(logs: str, t_kill: float) -> float:
    """When the first survivor logged its assignment after the kill (epoch seconds): the
    broker's failure detection and rejoin end there, streamkit's part starts."""
    stamps = []
    for day, clock, ms in re.findall(
        r"(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d),(\d{3}) INFO \S+: \S+: assigned processors", logs
    ):
        at = time.mktime(time.strptime(f"{day} {clock}", "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000
        if at >= t_kill:
            stamps.append(at)
    return min(stamps, default=float("nan"))


def _hosts(log: str) -> list[int]:
    """The processors a worker's log says it was last assigned."""
    found = re.findall(r"assigned processors \[([\d, ]*)\]", log)
    return [int(p) for p in found[-1].split(",") if p.strip()] if found else []


async def run(a: argparse.Namespace, keys: int, stores: str) -> dict[str, Any]:
    from streamkit.broker import resolve_broker
    from streamkit.kafkaio import KafkaIO
    from streamkit.testing import aproduce_json

    with resolve_broker(a.broker) as broker, tempfile.TemporaryDirectory(prefix="sk-failover-") as work:
        bootstrap = broker.bootstrap
        tag = uuid.uuid4().hex[:8]
        app, topic, out = f"failover-{tag}", f"failover-in-{tag}", f"failover-out-{tag}"
        env = dict(os.environ, SK_BENCH_APP=app, SK_BENCH_TOPIC=topic, SK_BENCH_OUT=out, STREAMKIT_BROKER=bootstrap,
                   STREAMKIT_PROCESSORS=str(PARTITIONS), STREAMKIT_SESSION_TIMEOUT_MS=str(a.session_timeout_ms),
                   STREAMKIT_HEARTBEAT_INTERVAL_MS=str(a.session_timeout_ms // 10), PYTHONPATH=str(ROOT))  # fmt: skip
        logs = [Path(work) / f"w{i}.log" for i in range(WORKERS)]
        cmd = [sys.executable, "-m", "streamkit.cli", "worker", "benchmarks.scaling_app:app", "--log-level", "INFO"]
        async with KafkaIO(bootstrap) as io:
            await io.create_topic(topic, PARTITIONS)
            await io.create_topic(out, PARTITIONS)
            now = time.time()
            await aproduce_json(bootstrap, topic, ((f"k{i}", {"seq": -1, "sent": now}) for i in range(keys)))
            workers = []
            for i, log in enumerate(logs):
                state = Path(work) / ("state" if stores == "shared" else f"state-{i}")
                replicas = "1" if stores == "standby" else "0"
                own = dict(env, STREAMKIT_STATE_DIR=str(state), STREAMKIT_STANDBY_REPLICAS=replicas)
                workers.append(subprocess.Popen(cmd, cwd=ROOT, env=own, stderr=open(log, "wb")))
            group = f"streamkit-{app}"
            await _wait_committed(io, group, topic, keys, 600)
            if stores == "standby":  # every processor's copy warm before the load
                await _wait_for_logs(logs, "standby of processor", PARTITIONS, 600)
            stop = asyncio.Event()
            producer = asyncio.create_task(produce(bootstrap, topic, a.rate, keys, stop))
            try:
                await asyncio.sleep(a.before)
                texts = [log.read_text() for log in logs]
                victim = next(i for i, text in enumerate(texts) if 0 in _hosts(text))
                lost = _hosts(texts[victim])
                workers[victim].send_signal(signal.SIGKILL)
                t_kill = time.time()
                print(f"killed worker {victim} at {time.strftime('%H:%M:%S')}", flush=True)
                await asyncio.sleep(a.after)
            finally:
                stop.set()
                sent = await producer
            await _wait_committed(io, group, topic, keys + sent, 600)
            for w in workers:
                if w.poll() is None:
                    w.send_signal(signal.SIGTERM)
            for w in workers:
                w.wait(60)
            records = await io.read_topic(out)
        said = "".join(log.read_text() for log in logs)
        if a.keep_logs:  # where the time after the kill went
            kept = Path(a.keep_logs) / f"{keys}-{stores}"
            kept.mkdir(parents=True, exist_ok=True)
            for log in logs:
                (kept / log.name).write_text(log.read_text(errors="replace"))
    lost_parts = set(lost)  # processor i reads partition i (p0 = partitions, nothing scaled)
    # the lost processors' records sent around the kill: (sent, output at); the dead worker wrote none after it
    around = sorted(
        (v["sent"], r.timestamp / 1000)
        for r in records
        if r.partition in lost_parts and (v := orjson.loads(r.value))["seq"] >= 0 and v["sent"] >= t_kill - 1
    )
    first_out = min((at for _, at in around if at >= t_kill), default=float("nan"))
    resumed = first_out - t_kill
    assigned = _assigned_after(said, t_kill)  # the survivors' new assignment: the broker's part ends there
    latencies = sorted(at - sent for sent, at in around)
    restored = [float(s) for s in re.findall(r"processor \d+ restored from the changelog in ([\d.]+) s", said)]
    promoted = len(re.findall(r"standby of processor \d+ promoted", said))
    return {
        "keys": keys,
        "stores": stores,
        "lost": lost,
        "records": len(latencies),
        "resumed": resumed,
        "detected": assigned - t_kill,
        "ours": first_out - assigned,
        "p50": statistics.median(latencies) if latencies else float("nan"),
        "p99": latencies[int(len(latencies) * 0.99)] if latencies else float("nan"),
        "worst": latencies[-1] if latencies else float("nan"),
        "restore_s": max(restored, default=0.0),
        "session_s": a.session_timeout_ms / 1000,
        "sent": sent,
        "outputs": sum(1 for r in records if orjson.loads(r.value)["seq"] >= 0),
        "promoted": promoted,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.failover", description=__doc__.split("\n")[0])
    parser.add_argument("--keys", default="100000,1000000", help="comma list of state sizes (keys)")
    parser.add_argument(
        "--stores", default="separate,standby,shared", help="separate (restore), standby (a warm copy), shared"
    )
    parser.add_argument("--rate", type=float, default=2000, help="input records/s after the state is loaded")
    parser.add_argument("--before", type=float, default=5.0, help="seconds of steady load before the kill")
    parser.add_argument("--after", type=float, default=20.0, help="seconds of load after the kill")
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--broker", default=None, help="a broker to use instead of an embedded one")
    parser.add_argument("--keep-logs", default=None, metavar="DIR", help="copy the workers' logs there")
    a = parser.parse_args()
    rows = []
    for keys in (int(k) for k in a.keys.split(",")):
        for stores in a.stores.split(","):
            print(
                f"{keys:,} keys, {stores} stores: loading the state, then killing a worker under load ...", flush=True
            )
            rows.append(asyncio.run(run(a, keys, stores)))
    table = Table(
        title=f"a worker SIGKILLed at {a.rate:,.0f} records/s: its processors' records sent from 1 s before the kill on"
    )
    for col in ("state keys", "stores", "processors lost", "records", "output again after s",
                "of which: detection + rejoin s", "assignment -> output s", "latency p50 s",
                "p99 s", "worst s", "restore s (log)", "standbys promoted", "session timeout s",
                "outputs >= sent"):  # fmt: skip
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            f"{r['keys']:,}", r["stores"], ", ".join(map(str, r["lost"])), f"{r['records']:,}", f"{r['resumed']:.2f}",
            f"{r['detected']:.2f}", f"{r['ours']:.2f}",
            f"{r['p50']:.2f}", f"{r['p99']:.2f}", f"{r['worst']:.2f}", f"{r['restore_s']:.2f}", str(r["promoted"]),
            f"{r['session_s']:.1f}",
            "yes" if r["outputs"] >= r["sent"] else f"NO ({r['outputs']:,} < {r['sent']:,})",
        )  # fmt: skip
    Console(width=None if Console().is_terminal else 160).print(table)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
