"""Latency at a fixed input rate: the time from a producer's send to the handler's call,
and to the output record being readable, for streamkit and quixstreams in the same run.

    python -m benchmarks.latency [--rate 5000] [--seconds 20] [--keys 1000]
        [--contenders raw:low,streamkit:throughput,streamkit:low,quix:throughput,quix:low]
        [--warmup 5]

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
no job: the floor that the broker and the clients set.

Printed per contender: p50, p99 and max of send-to-handler and of send-to-output, in ms,
and the records measured; then each streamkit figure as a ratio to quixstreams' figure
at the same setting.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
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

ROOT = Path(__file__).resolve().parent.parent
WARMUP_TIMEOUT = 60.0
DRAIN_TIMEOUT = 30.0
PRODUCER_LINGER_MS = 5


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(
    bootstrap: str, contender: str, rate: int, seconds: float, warmup: float, keys: int, workdir: Path
) -> dict[str, Any]:
    """One contender's run (see the module docstring)."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

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
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=PRODUCER_LINGER_MS, acks=1)
    reader = AIOKafkaConsumer(
        out if job else topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=5
    )
    await producer.start()
    await reader.start()
    to_handler: list[float] = []
    to_output: list[float] = []
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

    reading = asyncio.create_task(read())
    try:
        warm = asyncio.create_task(produce(first_output, measured=False))
        async with asyncio.timeout(WARMUP_TIMEOUT):
            await asyncio.shield(first_output.wait())
        await warm
        await produce(time.monotonic() + warmup, measured=False)
        measured_sent = await produce(time.monotonic() + seconds, measured=True)
        await producer.flush()
        producing = False
        async with asyncio.timeout(DRAIN_TIMEOUT):
            await reading
    finally:
        producing = False
        reading.cancel()
        await producer.stop()
        await reader.stop()
        if job is not None:
            job.send_signal(signal.SIGTERM)
            try:
                job.wait(20)
            except subprocess.TimeoutExpired:
                job.kill()
    if len(to_output) != measured_sent:
        raise RuntimeError(f"{contender}: {measured_sent} records sent, {len(to_output)} outputs read")
    return {
        "contender": contender,
        "records": measured_sent,
        "handler": [percentile(to_handler, q) * 1000 for q in (0.5, 0.99, 1.0)],
        "output": [percentile(to_output, q) * 1000 for q in (0.5, 0.99, 1.0)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(prog="benchmarks.latency")
    ap.add_argument("--rate", type=int, default=5000, help="input records/s")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per contender")
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds sent unmeasured after the first output")
    ap.add_argument("--contenders", default="raw:low,streamkit:throughput,streamkit:low,quix:throughput,quix:low")
    a = ap.parse_args()
    contenders = [c.strip() for c in a.contenders.split(",") if c.strip()]
    bad = [
        c
        for c in contenders
        if c.split(":")[0] not in ("raw", "streamkit", "quix") or not c.endswith((":low", ":throughput"))
    ]
    if bad:
        ap.error(f"unknown contender(s) {bad}: NAME:latency, NAME raw, streamkit or quix, latency low or throughput")

    from streamkit.broker import EmbeddedBroker

    rows = []
    with tempfile.TemporaryDirectory(prefix="sk-latency-") as tmp:
        for c in contenders:  # a broker each: the test broker slows down as its logs grow
            with EmbeddedBroker() as broker:
                rows.append(asyncio.run(measure(broker.bootstrap, c, a.rate, a.seconds, a.warmup, a.keys, Path(tmp))))
    table = Table(title=f"latency at {a.rate:,} records/s, {a.keys:,} keys, 4 partitions (ms)")
    for col in ("contender", "records", "send→handler p50", "p99", "max", "send→output p50", "p99", "max"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["contender"], f"{r['records']:,}", *(f"{x:.1f}" for x in r["handler"] + r["output"]))
    console = Console()
    console.print(table)
    by = {r["contender"]: r for r in rows}
    for setting in ("throughput", "low"):
        sk, quix = by.get(f"streamkit:{setting}"), by.get(f"quix:{setting}")
        if sk and quix:
            ratios = [
                s / q for s, q in zip(sk["handler"] + sk["output"], quix["handler"] + quix["output"], strict=True)
            ]
            console.print(f"{setting}: streamkit / quixstreams, send→handler p50 p99 max, send→output p50 p99 max: "
                          + " ".join(f"{x:.2f}" for x in ratios))  # fmt: skip


if __name__ == "__main__":
    main()
