"""The state path alone, without a broker: records through the worker's admission, a
task's apply step (decode, the handler, the write-back cache, RocksDB reads of keys the
cache lacks) and the checkpoint (each changed key serialised once into the store's batch
and the changelog's record batches, then RocksDB's write), on the harness's streamkit
job (count and sum of ``amount`` per key, one processor per partition) and its input.

    python -m benchmarks.state_path --records 1000000 --keys 10000,1000000 --repeat 3
    python -m benchmarks.state_path --records 1000000 --keys 1000000 --profile

What it leaves out is the broker: fetching and decoding fetch answers, sending the
changelog's batches, committing offsets (``benchmarks.harness`` runs the whole job
against the raw client). Per key count it prints records/s through the whole path and
the CPU microseconds per record of each stage and the RocksDB reads per record (cache
misses that the filter of stored keys did not answer), medians of the repeats (each in a fresh
state directory), and the ratio to the same work done in a plain dict in the same run
(decode, count and sum: the interpreter's floor); with ``--profile``, one more run under cProfile and the functions that
take the most time, in microseconds per record.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import random
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer, TopicPartition
from rich.console import Console
from rich.table import Table

import streamkit
from benchmarks.input import amount, key_indices
from streamkit.checkpoint_keys import PROCESSOR_COUNT
from streamkit.joins.merge import TimeMerge
from streamkit.kafkaio import FetchedRecord
from streamkit.layout.seal import OriginSeal
from streamkit.runtime import collector
from streamkit.runtime.admission import Admission
from streamkit.runtime.checkpointing import prepare_checkpoints
from streamkit.runtime.dispatch import Dispatcher
from streamkit.runtime.output import Output
from streamkit.runtime.processor import ProcessorState, StateMemory
from streamkit.runtime.routes import Route
from streamkit.runtime.task import Task, apply_fetched
from streamkit.state.changelog import ChangelogRecords
from streamkit.testdriver.capture import CaptureProducer
from streamkit.testing import default_partition

TOPIC = "state-path-in"
STAGES = ("apply", "serialise", "store write")
"""apply: admission, decode, handler, cache (and store reads of missing keys);
serialise: each changed key's value encoded once, into the store batch and the
changelog's record batches; store write: RocksDB's write of the batch."""


Answers = list[dict[TopicPartition, list[Any]]]
"""The input as fetch answers, in the order a consumer hands them over."""


@dataclass
class Run:
    records: int
    seconds: float = 0.0
    cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    checkpoints: int = 0
    changelog_records: int = 0
    store_reads: int = 0
    """Reads of RocksDB: cache misses the filter of stored keys did not answer."""

    def per_record(self, stage: str) -> float:
        return self.cpu[stage] / self.records * 1e6


def job() -> tuple[streamkit.App, Any]:
    """The harness's streamkit contender's job (``benchmarks.contenders.streamkit_app``)."""
    app = streamkit.App("state-path", changelog=True)
    source = app.topic(TOPIC, key_serde="raw")
    stats = app.table("stats", key_serde="raw", default=lambda: [0, 0])

    @app.processor(source)
    def count_and_sum(key: bytes, value: Any, ctx: streamkit.Context) -> None:
        s = stats[key]
        stats[key] = [s[0] + 1, s[1] + value["amount"]]

    return app, stats


def fetch_answers(records: int, keys: int, partitions: int, fetch: int) -> list[dict[TopicPartition, list[Any]]]:
    """The harness's input as fetch answers of ``fetch`` records per partition, the
    partitions in turn (as a consumer hands them over)."""
    per: list[list[FetchedRecord]] = [[] for _ in range(partitions)]
    placed = [default_partition(b"key-%d" % k, partitions) for k in range(keys)]
    for i, k in enumerate(key_indices(records, keys)):
        q = placed[k]
        value = b'{"amount":%d,"seq":%d}' % (amount(i), i)
        per[q].append(FetchedRecord(TOPIC, q, len(per[q]), 1_700_000_000_000 + i, b"key-%d" % k, value, ()))
    answers = []
    for start in range(0, max(len(p) for p in per), fetch):
        for q, recs in enumerate(per):
            if chunk := recs[start : start + fetch]:
                answers.append({TopicPartition(TOPIC, q): chunk})
    return answers


class _Fetcher:
    def pause(self, *_: TopicPartition) -> None: ...
    def resume(self, *_: TopicPartition) -> None: ...
    def seek(self, *_: Any) -> None: ...


async def run_once(answers: list[dict[TopicPartition, list[Any]]], partitions: int, every: int, workdir: Path) -> Run:
    app, _ = job()
    output = Output(app.name, app.dead_letter_topic, app.topics, CaptureProducer(), OriginSeal.ephemeral())
    dispatcher = Dispatcher("state-path", app.tables, output, failure_alarm_after=1 << 30)
    admission = Admission(_Fetcher(), group=app.group_id, name="state-path", seal=OriginSeal.ephemeral())
    tasks: dict[int, Task] = {}
    settings = app.settings  # the worker's memory: shared RocksDB cache and memtables, one cache budget
    memory = StateMemory.of(
        settings.state_cache_bytes, settings.rocksdb_block_cache_bytes, settings.rocksdb_memtable_bytes
    )
    for q in range(partitions):
        proc = await ProcessorState.open(q, workdir / f"processor-{q}", app.tables, 5.0, memory=memory)
        task = tasks[q] = Task(proc, dispatcher, TimeMerge(app.settings.max_task_idle_ms))
        route = Route.build(proc, app.handlers[TOPIC], (TOPIC, q), 0, None)
        admission.add(TopicPartition(TOPIC, q), route)
        task.read(TopicPartition(TOPIC, q), route)
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9")  # never started: it only builds record batches
    total = sum(len(recs) for a in answers for recs in a.values())
    run = Run(total)
    clock, cpu = time.perf_counter, time.process_time
    started, since = clock(), 0

    def checkpoint() -> None:
        t0 = cpu()
        writes = prepare_checkpoints(tasks.values(), {}, 0, {PROCESSOR_COUNT: partitions}, changelog=True)
        for proc, new in writes:
            batch = ChangelogRecords(producer, "state-path")
            prepared = proc.prepare_commit(batch.add)
            batch.builders()
            t1 = cpu()
            run.cpu["serialise"] += t1 - t0
            proc.finish_commit(prepared, new)
            t0 = cpu()
            run.cpu["store write"] += t0 - t1
            run.changelog_records += batch.count
        run.checkpoints += 1
        collector.settle()  # (the member's, after each checkpoint)

    try:
        for answer in answers:
            t0 = cpu()
            consumed, _ = await apply_fetched(admission, tasks, answer)
            run.cpu["apply"] += cpu() - t0
            since += consumed
            if since >= every:
                checkpoint()
                since = 0
        checkpoint()
        run.seconds = clock() - started
        run.store_reads = sum(c.misses - c.reads_spared for t in tasks.values() for c in t.proc.caches.values())
        check(answers, [v for task in tasks.values() for _, v in task.proc.store.items("stats")])
    finally:
        for task in tasks.values():
            task.close()
        await producer.stop()
    return run


def check(answers: Answers, stored: list[bytes]) -> None:
    """The stores hold every key once, and the counts and sums of every record (as the
    harness checks a contender)."""
    records = [r for a in answers for recs in a.values() for r in recs]
    values = [orjson.loads(v) for v in stored]
    want = (len({r.key for r in records}), len(records), sum(orjson.loads(r.value)["amount"] for r in records))
    got = (len(values), sum(n for n, _ in values), sum(total for _, total in values))
    assert got == want, f"the stores hold (keys, count, sum) {got}, not {want}"


def floor(answers: Answers) -> float:
    """Records/s of the same work in a dict, with nothing kept: decode each value, count
    and sum per key (the interpreter's floor for this job)."""
    loads = orjson.loads
    state: dict[bytes, list[int]] = {}
    started = time.perf_counter()
    for answer in answers:
        for records in answer.values():
            for r in records:
                s = state.get(r.key) or [0, 0]
                state[r.key] = [s[0] + 1, s[1] + loads(r.value)["amount"]]
    return sum(len(recs) for a in answers for recs in a.values()) / (time.perf_counter() - started)


def measure(answers: Answers, partitions: int, every: int) -> Run:
    """One run, with the worker's garbage collector settings (``runtime.collector``)."""
    workdir = Path(tempfile.mkdtemp(prefix="state-path-"))
    try:
        with collector.fewer_collections(streamkit.App("state-path").settings.gc_threshold):
            return asyncio.run(run_once(answers, partitions, every, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(prog="benchmarks.state_path", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--keys", default="10000,1000000", help="key counts, comma-separated")
    p.add_argument("--partitions", type=int, default=4, help="partitions, one processor each (the harness's 4)")
    p.add_argument("--fetch", type=int, default=500, help="records per partition per fetch answer")
    p.add_argument(
        "--checkpoint-records", type=int, default=250_000,
        help="records between checkpoints (the worker checkpoints every 2 s: about this many at 1M keys)",
    )  # fmt: skip
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="one more run under cProfile: the top functions")
    a = p.parse_args()
    console = Console(width=150)
    table = Table(title=f"state path, {a.records:,} records, {a.partitions} processors (medians of {a.repeat})")
    columns = (
        "keys",
        "records/s",
        "vs dict floor",
        *(f"{s} µs/rec" for s in STAGES),
        "CPU µs/rec",
        "store reads/rec",
        "keys/checkpoint",
    )
    for col in columns:
        table.add_column(col, justify="right")
    for keys in [int(k) for k in a.keys.split(",")]:
        answers = fetch_answers(a.records, keys, a.partitions, a.fetch)
        runs, floors = [], []
        for _ in range(a.repeat):  # interleaved
            runs.append(measure(answers, a.partitions, a.checkpoint_records))
            floors.append(floor(answers))
        med = statistics.median
        rate = med(r.records / r.seconds for r in runs)
        stages = [med(r.per_record(s) for r in runs) for s in STAGES]
        changed = med(r.changelog_records / r.checkpoints for r in runs)
        ratio = f"{rate / med(floors):.2f}x"
        reads = med(r.store_reads / r.records for r in runs)
        cells = [
            f"{keys:,}",
            f"{rate:,.0f}",
            ratio,
            *(f"{s:.2f}" for s in stages),
            f"{sum(stages):.2f}",
            f"{reads:.3f}",
        ]
        table.add_row(*cells, f"{changed:,.0f}")
        if a.profile:
            profile(answers, a.partitions, a.checkpoint_records, keys, console)
    console.print(table)


def profile(
    answers: list[dict[TopicPartition, list[Any]]], partitions: int, every: int, keys: int, console: Console
) -> None:
    records = sum(len(recs) for a in answers for recs in a.values())
    profiler = cProfile.Profile()
    profiler.enable()
    measure(answers, partitions, every)
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:20]  # type: ignore[attr-defined]
    top = Table(title=f"{keys:,} keys under cProfile: own time per record (cProfile slows the Python parts)")
    for col in ("function", "own µs/rec", "with callees µs/rec", "calls/rec"):
        top.add_column(col, justify="right" if col != "function" else "left")
    for (path, line, name), (_, calls, own, cumulative, _) in rows:
        where = f"{Path(path).name}:{line}({name})" if line else name
        top.add_row(where, f"{own / records * 1e6:.2f}", f"{cumulative / records * 1e6:.2f}", f"{calls / records:.2f}")
    console.print(top)


if __name__ == "__main__":
    random.seed(0)
    main()
