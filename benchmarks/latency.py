"""Latency at a fixed input rate: the time from a producer's send to the handler's call,
and to the output record being readable, for streamkit and quixstreams in the same run.

    python -m benchmarks.latency [--rate 5000] [--seconds 20] [--keys 1000] [--warmup 5]
        [--contenders raw:low,client:low,streamkit:throughput,streamkit:low,quix:throughput,quix:low]
        [--repeat 1] [--beside]

Per contender (``NAME:latency``, see ``benchmarks.latency_app``): an embedded broker of
its own (the test broker slows down as its logs grow: a shared one would favour the
first contender), fresh 4-partition input and output topics, the job in its own process.
A producer sends ``--rate`` records/s over ``--keys`` keys, each stamped with its send
time, lingering 5 ms as Kafka's own clients do by default (a producer that sends every
record alone makes the test broker slower and slower: at linger 0, even reading the input
directly reached a p99 of 200 ms within 8 s). The records until the job's first output,
and ``--warmup`` seconds more, are not measured (group join, backlog); then ``--seconds``
are. A reader of the output topic (fetch wait 5 ms, counted in the send-to-output
figure) notes when each output arrives. ``raw`` is that reader on the input topic, with
no job: the floor that the broker and the clients set. ``client`` is the same client as
a job of its own (``latency_app.run_client``: a group member and a producer in a process
of their own, no framework): what any job pays on this machine, beside the broker, before
a framework's code runs.

``--beside``: in each run of a job, a second reader of the input, in the benchmark's
process beside the reader of the output (fetch wait 5 ms, no group, no job code in its
path), notes when each measured record becomes readable: the floor under that run's own
load (the job's traffic on the broker and the cores, this reader's included). Printed as
one more column, and each job's send-to-handler figures as ratios to it.

Printed per contender: p50, p99 and max of send-to-handler and of send-to-output, in ms,
and the records measured (with ``--repeat N``, each contender runs N times, interleaved
with the others, each round started by the next contender, and each figure is the median
of its runs; the p99 of each run is printed too, in the order run); then each streamkit
figure as a ratio to the floor's and to the plain client's and quixstreams' at the same
setting.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
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

ROOT = Path(__file__).resolve().parent.parent
WARMUP_TIMEOUT = 60.0
DRAIN_TIMEOUT = 30.0
PRODUCER_LINGER_MS = 5


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def stop_all(tasks: list[asyncio.Task[Any]], started: list[Any]) -> None:
    """Cancel a run's reading tasks, then stop the clients it started, the last first."""
    for task in tasks:
        task.cancel()
    for client in reversed(started):
        await client.stop()


@dataclass(frozen=True)
class Pace:
    """What a run sends: ``rate`` records/s over ``keys`` keys, ``warmup`` seconds after
    the first output unmeasured, then ``seconds`` measured."""

    rate: int
    seconds: float
    warmup: float
    keys: int


async def measure(bootstrap: str, contender: str, pace: Pace, workdir: Path, beside: bool = False) -> dict[str, Any]:
    """One contender's run (see the module docstring)."""
    from streamkit.kafkaio import KafkaIO

    name, latency = contender.split(":")
    tag = uuid.uuid4().hex[:6]
    topic, out = f"lat-{tag}", f"lat-{tag}-out"
    async with KafkaIO(bootstrap) as io:
        await io.create_topic(topic, 4)
        await io.create_topic(out, 4)
    job = None
    if name != "raw":  # raw: the reader reads the input itself (the floor: send to readable)
        job = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.latency_app", name, bootstrap, topic, out, str(workdir / tag), latency],
            cwd=ROOT, stderr=open(workdir / f"{tag}.log", "wb"),
        )  # fmt: skip
    try:
        return await _run(bootstrap, contender, (topic, out), job is not None, beside, pace)
    finally:
        if job is not None:
            job.send_signal(signal.SIGTERM)
            try:
                job.wait(20)
            except subprocess.TimeoutExpired:
                job.kill()


async def _run(
    bootstrap: str, contender: str, topics: tuple[str, str], job: bool, beside: bool, pace: Pace
) -> dict[str, Any]:
    """:func:`measure`'s producer and readers, the job (if any) running."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic, out = topics
    rate, keys = pace.rate, pace.keys
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=PRODUCER_LINGER_MS, acks=1)
    reader = AIOKafkaConsumer(
        out if job else topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=5
    )
    side = (  # --beside: the input read in this process too, beside the job's output
        AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=5)
        if beside and job
        else None
    )
    started: list[Any] = []
    to_handler: list[float] = []
    to_output: list[float] = []
    to_side: list[float] = []
    first_output = asyncio.Event()
    measured_sent = 0
    producing = True

    async def read() -> None:
        while producing or len(to_output) < measured_sent:
            batch = await reader.getmany(timeout_ms=100)
            now = time.time()
            for records in batch.values():
                for rec in records:
                    first_output.set()
                    v = orjson.loads(rec.value)
                    if v["m"]:
                        to_handler.append(v.get("handled", now) - v["sent"])
                        to_output.append(now - v["sent"])

    async def produce(until: float | asyncio.Event, measured: bool) -> int:
        """Send at ``rate`` until the time or the event; returns how many were sent."""
        start, sent = time.monotonic(), 0
        while not (until.is_set() if isinstance(until, asyncio.Event) else time.monotonic() >= until):
            due = int((time.monotonic() - start) * rate)
            for i in range(sent, due):
                value = orjson.dumps({"sent": time.time(), "m": measured})
                await producer.send(topic, value, key=b"key-%d" % (i % keys))
            sent = max(sent, due)
            await asyncio.sleep(0.001)
        return sent

    async def read_beside() -> None:
        assert side is not None
        while producing or len(to_side) < measured_sent:
            batch = await side.getmany(timeout_ms=100)
            now = time.time()
            for records in batch.values():
                for rec in records:
                    v = orjson.loads(rec.value)
                    if v["m"]:
                        to_side.append(now - v["sent"])

    tasks: list[asyncio.Task[Any]] = []
    try:
        for client in (producer, reader, side):
            if client is not None:
                await client.start()
                started.append(client)
        tasks.append(asyncio.create_task(read()))
        if side is not None:
            tasks.append(asyncio.create_task(read_beside()))
        tasks.append(warm := asyncio.create_task(produce(first_output, measured=False)))
        async with asyncio.timeout(WARMUP_TIMEOUT):
            await asyncio.shield(first_output.wait())
        await warm
        await produce(time.monotonic() + pace.warmup, measured=False)
        measured_sent = await produce(time.monotonic() + pace.seconds, measured=True)
        await producer.flush()
        producing = False
        async with asyncio.timeout(DRAIN_TIMEOUT):
            await asyncio.gather(*tasks)
    finally:
        producing = False
        await stop_all(tasks, started)
    if len(to_output) != measured_sent or (side is not None and len(to_side) != measured_sent):
        raise RuntimeError(
            f"{contender}: {measured_sent} records sent, {len(to_output)} outputs read"
            + (f", {len(to_side)} inputs read beside" if side is not None else "")
        )
    return {
        "contender": contender,
        "records": measured_sent,
        "handler": [percentile(to_handler, q) * 1000 for q in (0.5, 0.99, 1.0)],
        "output": [percentile(to_output, q) * 1000 for q in (0.5, 0.99, 1.0)],
        "beside": [percentile(to_side, q) * 1000 for q in (0.5, 0.99, 1.0)] if side is not None else None,
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One contender's repeats as one row: each figure the median of the runs' figures;
    ``p99s`` keeps every run's send-to-handler p99, to show the spread."""
    return {
        "contender": runs[0]["contender"],
        "records": statistics.median(r["records"] for r in runs),
        "handler": [statistics.median(r["handler"][i] for r in runs) for i in range(3)],
        "output": [statistics.median(r["output"][i] for r in runs) for i in range(3)],
        "p99s": [r["handler"][1] for r in runs],
        "beside": [statistics.median(r["beside"][i] for r in runs) for i in range(3)] if runs[0]["beside"] else None,
        "beside_p99s": [r["beside"][1] for r in runs] if runs[0]["beside"] else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(prog="benchmarks.latency")
    ap.add_argument("--rate", type=int, default=5000, help="input records/s")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per contender")
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds sent unmeasured after the first output")
    ap.add_argument(
        "--contenders", default="raw:low,client:low,streamkit:throughput,streamkit:low,quix:throughput,quix:low"
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs per contender, interleaved; figures are medians")
    ap.add_argument(
        "--beside",
        action="store_true",
        help="in each job's run, the input read beside it too (the floor under its load)",
    )
    a = ap.parse_args()
    if a.repeat < 1:
        ap.error(f"--repeat {a.repeat}: runs per contender, at least 1")
    contenders = [c.strip() for c in a.contenders.split(",") if c.strip()]
    if len(set(contenders)) < len(contenders):
        ap.error(f"--contenders {a.contenders}: each at most once (--repeat runs each several times)")
    bad = [
        c
        for c in contenders
        if c.split(":")[0] not in ("raw", "client", "streamkit", "quix") or not c.endswith((":low", ":throughput"))
    ]
    if bad:
        ap.error(
            f"unknown contender(s) {bad}: NAME:latency, NAME raw, client, streamkit or quix, latency low or throughput"
        )

    from streamkit.broker import EmbeddedBroker

    pace = Pace(a.rate, a.seconds, a.warmup, a.keys)
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in contenders}
    with tempfile.TemporaryDirectory(prefix="sk-latency-") as tmp:
        for i in range(a.repeat):  # interleaved: a slow spell of the machine hits every contender alike
            turn = i % len(contenders)  # and each round starts with the next contender: none always runs first
            for c in contenders[turn:] + contenders[:turn]:  # a broker each: the test broker slows as its logs grow
                with EmbeddedBroker() as broker:
                    runs[c].append(asyncio.run(measure(broker.bootstrap, c, pace, Path(tmp), a.beside)))
    rows = [medians(runs[c]) for c in contenders]
    what = f"medians of {a.repeat} interleaved runs, " if a.repeat > 1 else ""
    table = Table(title=f"latency at {a.rate:,} records/s, {a.keys:,} keys, 4 partitions ({what}ms)")
    for col in ("contender", "records", "send→handler p50", "p99", "max", "send→output p50", "p99", "max"):
        table.add_column(col, justify="right")
    if a.repeat > 1:
        table.add_column("p99 of each run", justify="right")
    if a.beside:
        for col in ("input read beside p50", "p99", "max"):
            table.add_column(col, justify="right")
        if a.repeat > 1:
            table.add_column("its p99 of each run", justify="right")
    for r in rows:
        cells = [r["contender"], f"{r['records']:,.0f}", *(f"{x:.1f}" for x in r["handler"] + r["output"])]
        if a.repeat > 1:
            cells.append(" ".join(f"{x:.0f}" for x in r["p99s"]))
        if a.beside:
            cells += [f"{x:.1f}" for x in r["beside"]] if r["beside"] else ["-"] * 3
            if a.repeat > 1:
                cells.append(" ".join(f"{x:.0f}" for x in r["beside_p99s"]) if r["beside"] else "-")
        table.add_row(*cells)
    console = Console(width=200)
    console.print(table)
    by = {r["contender"]: r for r in rows}
    floor = next((r for c, r in by.items() if c.startswith("raw:")), None)  # raw's setting changes nothing
    for setting in ("throughput", "low"):
        sk = by.get(f"streamkit:{setting}")
        for peer in ("raw", "client", "quix"):
            other = floor if peer == "raw" else by.get(f"{peer}:{setting}")
            if sk and other:
                ratios = [
                    s / o for s, o in zip(sk["handler"] + sk["output"], other["handler"] + other["output"], strict=True)
                ]
                console.print(f"{setting}: streamkit / {peer}, send→handler p50 p99 max, send→output p50 p99 max: "
                              + " ".join(f"{x:.2f}" for x in ratios))  # fmt: skip
    for r in rows:
        if r["beside"]:
            ratios = [h / b for h, b in zip(r["handler"], r["beside"], strict=True)]
            console.print(f"{r['contender']}: send→handler / the input read beside it, p50 p99 max: "
                          + " ".join(f"{x:.2f}" for x in ratios))  # fmt: skip


if __name__ == "__main__":
    main()
