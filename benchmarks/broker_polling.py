"""How the broker answers readers that wait for records: whether a fetch held for data
returns when a record arrives (a long poll) or only when its wait is over, and what each
reader polling at a given fetch wait costs the broker's CPU.

    python -m benchmarks.broker_polling [--rate 5000] [--seconds 6] [--repeat 3]
        [--readers 5 500 5,5,5 500,500,500] [--bootstrap HOST:PORT]

Per reader set (``5,5,5``: three readers, each with a fetch wait of 5 ms): a fresh
4-partition topic, a producer sending ``--rate`` records/s over 1,000 keys (linger 5 ms,
as ``benchmarks.latency`` sends), each record stamped with its send time, and the readers
in this process, each noting when every record reaches it. Printed per set: the broker's
CPU share while the records were sent, and each reader's send-to-read p50 and p99 in ms
(medians of ``--repeat`` interleaved runs, each against a broker started for it).

A broker that wakes a held fetch when a record arrives reads alike at any fetch wait; one
that does not holds records back until the fetch returns, so a reader that wants records
soon must ask again and again, and each such reader costs the broker CPU whether records
come or not. ``benchmarks.latency`` measures jobs on the same
broker: read its figures with these beside them.

``--bootstrap``: an external broker instead (its CPU is not measured).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from benchmarks.latency import PRODUCER_LINGER_MS, percentile, stop_all


@dataclass(frozen=True)
class Outcome:
    """One run of one reader set: the broker's CPU share (None: not measured) and each
    reader's send-to-read p50 and p99 (ms)."""

    cpu: float | None
    reads: list[tuple[float, float]]


def broker_cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_once(bootstrap: str, pid: int | None, waits: tuple[int, ...], rate: int, seconds: float) -> Outcome:
    """Send at ``rate`` for ``seconds`` to a new topic read by one reader per fetch wait."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from streamkit.kafkaio import KafkaIO

    topic = f"polling-{uuid.uuid4().hex[:6]}"
    async with KafkaIO(bootstrap) as io:
        await io.create_topic(topic, 4)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=PRODUCER_LINGER_MS, acks=1)
    readers = [
        AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, fetch_max_wait_ms=wait, auto_offset_reset="earliest")
        for wait in waits
    ]
    delays: list[list[float]] = [[] for _ in readers]
    sent = 0

    async def read(reader: AIOKafkaConsumer, into: list[float]) -> None:
        while len(into) < sent or sending:
            batch = await reader.getmany(timeout_ms=100)
            now = time.time()
            into.extend(now - orjson.loads(rec.value)["sent"] for records in batch.values() for rec in records)

    sending = True
    started: list[Any] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        for client in (producer, *readers):
            await client.start()
            started.append(client)
        tasks = [asyncio.create_task(read(reader, into)) for reader, into in zip(readers, delays, strict=True)]
        cpu0, wall0 = (broker_cpu_seconds(pid) if pid else 0.0), time.monotonic()
        while (elapsed := time.monotonic() - wall0) < seconds:
            for i in range(sent, int(elapsed * rate)):
                await producer.send(topic, orjson.dumps({"sent": time.time()}), key=b"key-%d" % (i % 1000))
                sent = i + 1
            await asyncio.sleep(0.001)
        await producer.flush()
        cpu = 100 * (broker_cpu_seconds(pid) - cpu0) / (time.monotonic() - wall0) if pid else None
        sending = False
        try:
            async with asyncio.timeout(30):
                await asyncio.gather(*tasks)
        except TimeoutError:
            pass  # (the counts below say what was not read)
    finally:
        sending = False
        await stop_all(tasks, started)
    if any(len(into) != sent for into in delays):
        raise RuntimeError(f"{sent} records sent, read: {[len(into) for into in delays]}")
    return Outcome(cpu, [(percentile(d, 0.5) * 1000, percentile(d, 0.99) * 1000) for d in delays])


async def run_set(bootstrap: str | None, waits: tuple[int, ...], rate: int, seconds: float) -> Outcome:
    """:func:`run_once` against ``bootstrap``, or against an embedded broker of its own."""
    if bootstrap is not None:
        return await run_once(bootstrap, None, waits, rate, seconds)
    from streamkit.broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        return await run_once(broker.bootstrap, broker.pid, waits, rate, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.broker_polling", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--readers", nargs="+", default=["5", "500", "5,5,5", "500,500,500"])
    parser.add_argument("--bootstrap", default=None)
    a = parser.parse_args()
    sets = [tuple(int(w) for w in spec.split(",")) for spec in a.readers]
    runs: dict[tuple[int, ...], list[Outcome]] = {waits: [] for waits in sets}
    for _ in range(a.repeat):  # interleaved: each round runs every set once
        for waits in sets:
            runs[waits].append(asyncio.run(run_set(a.bootstrap, waits, a.rate, a.seconds)))
    table = Table(title=f"{a.rate:,} records/s over 4 partitions (medians of {a.repeat} interleaved runs)")
    for column in ("readers' fetch waits (ms)", "broker CPU %", "each reader: send→read p50 / p99 (ms)"):
        table.add_column(column, justify="right")
    for waits, outcomes in runs.items():
        cpus = [o.cpu for o in outcomes if o.cpu is not None]
        reads = [
            f"{statistics.median(o.reads[i][0] for o in outcomes):.1f} / "
            f"{statistics.median(o.reads[i][1] for o in outcomes):.1f}"
            for i in range(len(waits))
        ]
        cpu = f"{statistics.median(cpus):.0f}" if cpus else "-"
        table.add_row(",".join(map(str, waits)), cpu, "   ".join(reads))
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
