"""Benchmark: shared tasks, one partition consumed by processors that split it by key range.

    python -m benchmarks.sharing [--records 200000] [--keys 1000] [--burn-us 50]

One input partition holds ``--records`` records over ``--keys`` keys (written by the
streamkit producer). Each case runs the `benchmarks/sharing_app.py` job in fresh
`streamkit worker` processes until the group's committed offset reaches the end of the
partition (for a shared partition, the lowest sharer's); records/s is the partition's
records over the time from the first record any worker applied to the last:

- CPU-bound (``--burn-us`` of CPU per record): one processor in one worker, vs two
  processors sharing the partition by key range in two workers (one per core; goal:
  at least 1.6x);
- skip before decode (no burn): one processor owning every key, vs two sharers, each
  reading the whole partition and skipping the other's half before decoding values;
- I/O-bound (an async handler awaiting 5 ms per record, ``--io-records`` records):
  key-level concurrency 1 vs ``--concurrency`` (goal: at least 50x).

Printed: records/s per case and the ratios, from the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


async def produce(bootstrap: str, topic: str, n: int, keys: int) -> None:
    from streamkit.producer import Producer

    async with Producer(bootstrap, client_id="sharing-bench") as p:
        for i in range(n):
            await p.send(topic, f"k{i % keys}", {"amount": i % 100, "seq": i})
        await p.flush()


async def run_case(
    bootstrap: str,
    topic: str,
    n: int,
    processors: int,
    burn_us: int,
    work: Path,
    sleep_ms: float = 0,
    concurrency: int = 1,
) -> float:
    """records/s of a fresh job of ``processors`` processors, one worker each."""
    from streamkit.kafkaio import KafkaIO

    app = f"sharing-{uuid.uuid4().hex[:8]}"
    times = work / f"{app}-times"
    times.mkdir()
    env = dict(os.environ, SK_BENCH_APP=app, SK_BENCH_TOPIC=topic, SK_BENCH_BURN_US=str(burn_us),
               SK_BENCH_TIMES=str(times), SK_BENCH_SLEEP_MS=str(sleep_ms), SK_BENCH_CONCURRENCY=str(concurrency),
               STREAMKIT_BROKER=bootstrap, STREAMKIT_STATE_DIR=str(work / app), STREAMKIT_PROCESSORS=str(processors),
               STREAMKIT_SESSION_TIMEOUT_MS="2000", STREAMKIT_HEARTBEAT_INTERVAL_MS="200",
               PYTHONPATH=str(ROOT))  # fmt: skip
    cmd = [sys.executable, "-m", "streamkit.cli", "worker", "benchmarks.sharing_app:app"]
    workers = [
        subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=open(work / f"{app}-w{i}.log", "wb")) for i in range(processors)
    ]
    try:
        async with KafkaIO(bootstrap) as io:
            deadline = time.monotonic() + 600
            while ((await io.committed(f"streamkit-{app}", topic, [0])).get(0) or 0) < n:
                if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
                    raise SystemExit(f"case {processors} processors failed: see {work}")
                await asyncio.sleep(0.1)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(60)
    seen = [orjson.loads(f.read_bytes()) for f in sorted(times.iterdir())]
    applied = sum(s["records"] for s in seen)
    if applied != n:
        raise SystemExit(f"case {processors} processors applied {applied} records, not {n}")
    return n / (max(s["last"] for s in seen) - min(s["first"] for s in seen))


async def main(a: argparse.Namespace) -> None:
    from streamkit.broker import resolve_broker
    from streamkit.kafkaio import KafkaIO

    console = Console()
    with resolve_broker(a.broker) as broker, tempfile.TemporaryDirectory(prefix="sk-sharing-") as tmp:
        bootstrap, work = broker.bootstrap, Path(tmp)
        topic = f"sharing-in-{uuid.uuid4().hex[:8]}"
        async with KafkaIO(bootstrap) as io:
            await io.create_topic(topic, 1)
        await produce(bootstrap, topic, a.records, a.keys)
        cpu_1 = await run_case(bootstrap, topic, a.records, 1, a.burn_us, work)
        cpu_2 = await run_case(bootstrap, topic, a.records, 2, a.burn_us, work)
        cheap_1 = await run_case(bootstrap, topic, a.records, 1, 0, work)
        cheap_2 = await run_case(bootstrap, topic, a.records, 2, 0, work)
        io_topic = f"sharing-io-{uuid.uuid4().hex[:8]}"
        async with KafkaIO(bootstrap) as io:
            await io.create_topic(io_topic, 1)
        await produce(bootstrap, io_topic, a.io_records, a.keys)
        io_1 = await run_case(bootstrap, io_topic, a.io_records, 1, 0, work, sleep_ms=5, concurrency=1)
        io_n = await run_case(bootstrap, io_topic, a.io_records, 1, 0, work, sleep_ms=5, concurrency=a.concurrency)
    table = Table(title=f"shared tasks: 1 partition, {a.records:,} records, {a.keys:,} keys")
    for col in ("case", "records/s", "ratio"):
        table.add_column(col, justify="left" if col == "case" else "right")
    table.add_row(f"CPU-bound ({a.burn_us} µs/record): 1 processor, 1 worker", f"{cpu_1:,.0f}", "1.00x")
    table.add_row("CPU-bound: 2 processors sharing the partition, 2 workers", f"{cpu_2:,.0f}", f"{cpu_2 / cpu_1:.2f}x")
    table.add_row("cheap handler: 1 processor owning every key", f"{cheap_1:,.0f}", "1.00x")
    table.add_row(
        "cheap handler: 2 sharers, each skipping half before decoding", f"{cheap_2:,.0f}", f"{cheap_2 / cheap_1:.2f}x"
    )
    table.add_row(f"I/O-bound (awaits 5 ms/record, {a.io_records:,} records): concurrency 1", f"{io_1:,.0f}", "1.00x")
    table.add_row(f"I/O-bound: concurrency {a.concurrency} (keys in order)", f"{io_n:,.0f}", f"{io_n / io_1:.1f}x")
    console.print(table)
    console.print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sharing", description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", default=None, help="bootstrap address (default: an embedded broker)")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--burn-us", type=int, default=50, help="CPU microseconds per record in the CPU-bound cases")
    ap.add_argument("--io-records", type=int, default=3_000, help="records of the I/O-bound cases")
    ap.add_argument("--concurrency", type=int, default=100, help="key-level concurrency of the I/O-bound case")
    asyncio.run(main(ap.parse_args()))
