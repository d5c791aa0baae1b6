"""The cost of ordered delivery: steady throughput on vs off, and gate waits during expansions.

    python -m benchmarks.gating [--records 1000000] [--keys 10000] [--rate 20000] [--runs 2]
                                [--pairs ordered,plain]

1. Steady state. Topics with layouts of 4 active partitions, each holding the same N
   records of `--keys` keys. "on" and "off": room for 8 partitions, ordered delivery on
   or off, records written by the streamkit producer (every record is stamped with its
   epoch, once per batch, and the consumer checks it). "unstamped": the same records
   written by a plain producer where linear hashing places them, ordered delivery on, so
   the consumer looks up or hashes every key to know it is in place. Every topic is
   checked (a plain one or one with a layout: librdkafka's partitioner misplaces keys
   even where murmur2's would not), so the "plain" pair measures a plain producer's
   records against streamkit's stamped ones on the same kind of topic. The streamkit
   count+sum job (benchmarks.contenders.streamkit_app) consumes each, cycling through the modes
   `--runs` times (every other round in reverse order); records/s first to last record,
   median per mode. A cost is the median over rounds of the ratio within a round (the
   two modes of a pair run back to back, each first in every other round, so a machine
   whose speed drifts does not show as a cost).
   Beside records/s, each run's CPU per record (every thread of the job's process, first
   record to last), which that drift moves least; its cost is paired the same way.
   Each cost comes with a 90% bootstrap interval of its median: on a shared 2-core
   machine one run's speed moves by a fifth or more with what the neighbours do, so a
   cost of a few percent needs 20 rounds or more. `--pairs` picks the costs to measure
   (fewer modes per round, so more rounds in the same time).
2. Under load. A producer process writes at `--rate` records/s while a worker (in this
   process) consumes; the topic expands 4 -> 6 -> 8. For every partition created, the
   time it was gated (from assignment until the group passed its parent's seal) is
   the longest any record of it waited at the gate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


async def produce(bootstrap: str, topic: str, n: int, keys: int, rate: float | None = None) -> None:
    from streamkit.producer import Producer

    async with Producer(bootstrap, client_id=f"bench-{uuid.uuid4().hex[:6]}") as p:
        start = time.monotonic()
        for i in range(n):
            await p.send(topic, b"key-%d" % (i % keys), {"amount": i % 100, "seq": i})
            if rate and i % 500 == 0:
                ahead = i / rate - (time.monotonic() - start)
                if ahead > 0:
                    await asyncio.sleep(ahead)
        await p.flush()


def run_job(bootstrap: str, topic: str, n: int, workdir: str) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.contenders.streamkit_app",
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--records",
            str(n),
            "--partitions",
            "4",
            "--workdir",
            workdir,
            "--session-timeout-ms",
            "6000",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    r = json.loads(line[len("RESULT ") :])
    r["rate"] = r["records"] / (r["last_record_at"] - r["first_record_at"])
    return r


STEADY_MODES = {
    # mode: (ordered delivery, physical partitions, stamped by streamkit's producer), in the
    # order a round runs them: the two modes of each compared pair run back to back
    "off": (False, 8, True),
    "on": (True, 8, True),
    "unstamped": (True, 8, False),
}


PAIRS = {
    # cost: (mode, the mode it is compared with, what it is)
    "ordered": ("on", "off", "ordered delivery"),
    "plain": ("unstamped", "on", "a plain producer's records against streamkit's (every key checked)"),
}


async def produce_plain(bootstrap: str, topic: str, n: int, keys: int) -> None:
    """A plain Kafka producer writing where linear hashing over 4 partitions places each key
    (so nothing is a stray, but the consumer must hash every key to know it)."""
    from assignors.linear_hashing import partition_for_key
    from streamkit.testing import aproduce_json

    chunk = 100_000
    for start in range(0, n, chunk):
        await aproduce_json(
            bootstrap, topic,
            [(k, {"amount": i % 100, "seq": i}, partition_for_key(k, 4, 4))
             for i in range(start, min(n, start + chunk)) for k in (b"key-%d" % (i % keys),)],
        )  # fmt: skip


async def steady(
    bootstrap: str, n: int, keys: int, runs: int, modes: list[str], console: Console
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per mode, per round: records/s, and the job's CPU µs per record (every thread of
    its process, first record to last: what the modes cost, whatever else the machine does)."""
    from streamkit.layout.protocol import LayoutCoordinator

    topics = {}
    async with LayoutCoordinator(bootstrap) as coord:
        for mode in modes:
            ordered, physical, stamped = STEADY_MODES[mode]
            topics[mode] = f"gating-{mode.replace(' ', '').replace(',', '-')}-{uuid.uuid4().hex[:6]}"
            await coord.create(topics[mode], 4, capacity=physical, ordered_delivery=ordered)
            t0 = time.monotonic()
            await (produce if stamped else produce_plain)(bootstrap, topics[mode], n, keys)
            what = "stamped" if stamped else "unstamped"
            console.print(f"produced {n} {what} records to {topics[mode]} in {time.monotonic() - t0:.1f} s")
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    for i in range(runs):
        # every other round in reverse: a machine that speeds up or slows down over a
        # pair of rounds favours each mode of a pair once
        for mode in modes if i % 2 == 0 else reversed(modes):
            with tempfile.TemporaryDirectory() as wd:
                r = run_job(bootstrap, topics[mode], n, wd)
            assert r["check"]["count"] == n, r
            rates[mode].append(r["rate"])
            cpu[mode].append(r["cpu_window_s"] / r["records"] * 1e6)
            console.print(f"{mode}: {r['rate']:,.0f} records/s, {cpu[mode][-1]:.2f} CPU µs/record")
    return rates, cpu


async def under_load(bootstrap: str, rate: float, console: Console) -> list[tuple[str, int, float]]:
    import streamkit
    from streamkit.layout.protocol import LayoutCoordinator
    from streamkit.runtime.worker import Worker

    topic = f"gating-load-{uuid.uuid4().hex[:6]}"
    seconds = 12
    async with LayoutCoordinator(bootstrap) as coord:
        await coord.create(topic, 4, capacity=8)
        producer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.gating",
                "--produce-only",
                topic,
                "--bootstrap",
                bootstrap,
                "--records",
                str(int(rate * seconds)),
                "--rate",
                str(rate),
            ],
            cwd=ROOT,
        )
        with tempfile.TemporaryDirectory() as wd:
            app = streamkit.App(
                f"gating-{uuid.uuid4().hex[:6]}",
                broker=bootstrap,
                state_dir=Path(wd),
                session_timeout_ms=6000,
                commit_interval=0.5,
            )
            counts = app.table("counts", key_serde="raw", default=int)
            handled = [0]

            @app.processor(app.topic(topic, key_serde="raw"))
            def count(key: bytes, value: Any, ctx: Any) -> None:
                counts[key] += 1
                handled[0] += 1

            worker = Worker(app, 1)
            task = asyncio.create_task(worker.run())
            while handled[0] < rate * 2:
                await asyncio.sleep(0.05)
            for n in (6, 8):
                t0 = time.monotonic()
                res = await coord.expand(topic, n)
                console.print(f"expanded to {n} in {time.monotonic() - t0:.2f} s (acked by {len(res.acked)} producers)")
                await asyncio.sleep(3)
            await asyncio.to_thread(producer.wait)
            total = int(rate * seconds)
            while handled[0] < total:
                await asyncio.sleep(0.05)
            worker.stop()
            await task
            return [w for m in worker.members for w in m.admission.gate_waits]


def interval(ratios: list[float], level: float = 0.9) -> tuple[float, float]:
    """Bootstrap interval of the median of ``ratios``: how far another set of as many rounds
    on the same machine could put it (fixed seed, so a report reads the same twice)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    cut = int(len(medians) * (1 - level) / 2)
    return medians[cut], medians[-1 - cut]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--rate", type=float, default=20_000)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--keys", type=int, default=10_000, help="distinct keys in the steady-state topics")
    ap.add_argument("--pairs", default=",".join(PAIRS), help=f"costs to measure, of {', '.join(PAIRS)}")
    ap.add_argument("--bootstrap")
    ap.add_argument("--produce-only", metavar="TOPIC")
    a = ap.parse_args()
    if a.produce_only:
        asyncio.run(produce(a.bootstrap, a.produce_only, a.records, 10_000, a.rate))
        return
    pairs = [p.strip() for p in a.pairs.split(",") if p.strip()]
    if unknown := [p for p in pairs if p not in PAIRS]:
        ap.error(f"--pairs: unknown {', '.join(unknown)} (known: {', '.join(PAIRS)})")
    # in the order of STEADY_MODES: the two modes of each pair run back to back
    modes = [m for m in STEADY_MODES if any(m in PAIRS[p][:2] for p in pairs)]
    from streamkit.broker import EmbeddedBroker

    console = Console()
    with EmbeddedBroker() as broker:
        rates, cpu = asyncio.run(steady(broker.bootstrap, a.records, a.keys, a.runs, modes, console))
        waits = asyncio.run(under_load(broker.bootstrap, a.rate, console))
    med = {mode: statistics.median(r) for mode, r in rates.items()}
    title = f"steady state ({a.records:,} records, {a.keys:,} keys, 4 active partitions, median of {a.runs})"
    table = Table(title=title)
    for col in ("mode", "ordered delivery", "physical", "input", "records/s", "runs", "CPU µs/record"):
        table.add_column(col)
    for mode in modes:
        ordered, physical, stamped = STEADY_MODES[mode]
        table.add_row(
            mode, "on" if ordered else "off", str(physical), "stamped" if stamped else "plain producer",
            f"{med[mode]:,.0f}", ", ".join(f"{r:,.0f}" for r in rates[mode]),
            ", ".join(f"{c:.2f}" for c in cpu[mode]),
        )  # fmt: skip
    console.print(table)

    def cost(mode: str, base: str, what: str) -> None:
        # Paired per round (the modes of a pair run back to back, first one then the other
        # first), so that a machine whose speed drifts does not show up as a cost.
        paired = [a / b for a, b in zip(rates[mode], rates[base], strict=True)]
        ratio = statistics.median(paired)
        lo, hi = interval(paired)
        console.print(
            f"{what}: {mode} / {base} = {ratio:.3f} ({(1 - ratio) * 100:+.1f}% cost; target under 5%; "
            f"90% interval {(1 - hi) * 100:+.1f}% .. {(1 - lo) * 100:+.1f}%), "
            f"median of the {len(paired)} rounds' ratios {', '.join(f'{x:.3f}' for x in paired)}; "
            f"ratio of the medians {med[mode] / med[base]:.3f}"
        )
        # CPU per record: what the machine's drift in wall-clock speed moves least
        extra = [c / d for c, d in zip(cpu[mode], cpu[base], strict=True)]
        lo, hi = interval(extra)
        console.print(
            f"  CPU per record: {mode} / {base} = {statistics.median(extra):.3f} "
            f"({(statistics.median(extra) - 1) * 100:+.1f}% cost; 90% interval {(lo - 1) * 100:+.1f}% .. "
            f"{(hi - 1) * 100:+.1f}%), "
            f"medians {statistics.median(cpu[mode]):.2f} / {statistics.median(cpu[base]):.2f} µs"
        )

    for p in pairs:
        cost(*PAIRS[p])
    gates = Table(title=f"gates during expansions 4 -> 6 -> 8 under {a.rate:,.0f} records/s")
    for col in ("topic", "partition", "gated for (s)"):
        gates.add_column(col)
    for topic, part, secs in waits:
        gates.add_row(topic, str(part), f"{secs:.3f}")
    console.print(gates)
    if waits:
        console.print(f"longest time any key's records waited at a gate: {max(w[2] for w in waits):.3f} s")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    main()
