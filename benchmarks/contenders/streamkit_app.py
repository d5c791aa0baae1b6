"""streamkit contender: per-key count and sum of `amount` in RocksDB state, checkpointing on.

    python -m benchmarks.contenders.streamkit_app --bootstrap B --topic T --records N \
        --partitions P --workdir DIR --session-timeout-ms MS

One worker process hosting every processor (p0 = the partition count), default settings
(checkpoint every 2 s: the changed keys and a marker to the job's changelog, state
changes + positions in one RocksDB batch, then the Kafka offset commit; as
``streamkit-nolog``, ``BENCH_CONTENDER`` says, without the changelog; as
``streamkit-metrics``, with its Prometheus metrics served and scraped every second; as
``streamkit-nowrite``, with every checkpoint's RocksDB write left out, see
:func:`leave_stores_unwritten`; as ``streamkit-nostate``, with no state in its
checkpoints, see :func:`leave_state_out`). The handler
stops the worker when N records have been handled; the check
is read back from the processors' RocksDB stores after the worker has closed them.
``cpu_window_s``: the process's CPU seconds (every thread) from the first record to the last.
"""

# First: importing benchmarks.contenders takes PROCESS_START, before any heavy import.
from benchmarks.contenders import PROCESS_START, check_totals, emit_result, parse_args

# isort: split
import asyncio
import os
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

import streamkit
from stores.rocksdb import PreparedCommit, RocksDBStore
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.worker import Worker

UNCHECKED = ("streamkit-nowrite", "streamkit-nostate")
"""Upper bounds, not jobs: their stores stay empty."""


def main() -> None:
    a = parse_args(prog="benchmarks.contenders.streamkit_app")

    contender = os.environ.get("BENCH_CONTENDER") or "streamkit"
    metrics_port = _free_port() if contender == "streamkit-metrics" else None
    app = streamkit.App(
        f"bench-{uuid.uuid4().hex[:8]}",
        broker=a.bootstrap,
        state_dir=Path(a.workdir) / "state",
        session_timeout_ms=a.session_timeout_ms,
        changelog=contender != "streamkit-nolog",
        metrics_port=metrics_port,
        processing="exactly_once" if contender.startswith("streamkit-eos") else "at_least_once",
    )
    out, sink = _outputs(app, contender, a)
    if contender == "streamkit-nowrite":
        leave_stores_unwritten()
    if contender == "streamkit-nostate":
        leave_state_out()
    if metrics_port is not None:  # scraped every second, as Prometheus would
        threading.Thread(target=_scrape, args=(metrics_port,), daemon=True).start()
    source = app.topic(a.topic, key_serde="raw")
    stats = app.table("stats", key_serde="raw", default=lambda: [0, 0])
    progress = {"n": 0, "first": 0.0, "last": 0.0, "cpu_first": 0.0, "cpu_last": 0.0}
    target = a.records
    worker = Worker(app, 1)

    @app.processor(source)
    def count_and_sum(key: bytes, value: Any, ctx: streamkit.Context) -> None:
        s = stats[key]
        s = stats[key] = [s[0] + 1, s[1] + value["amount"]]
        if out is not None:
            ctx.send(out, key, s)
        if sink is not None:
            ctx.write(sink, {"key": key.decode(), "n": s[0], "total": s[1]})
        n = progress["n"] = progress["n"] + 1
        if n == 1:
            progress["first"], progress["cpu_first"] = time.time(), time.process_time()
        elif n == target:
            progress["last"], progress["cpu_last"] = time.time(), time.process_time()
            worker.stop()

    asyncio.run(worker.run())

    emit_result(
        records=progress["n"],
        first_record_at=progress["first"],
        last_record_at=progress["last"],
        process_start=PROCESS_START,
        check=None if contender in UNCHECKED else check_totals(stored_stats(app, a.partitions)),
        cpu_window_s=progress["cpu_last"] - progress["cpu_first"],
    )


def _outputs(app: streamkit.App, contender: str, a: Any) -> tuple[Any, Any]:
    """The output topic (``streamkit-out`` and ``streamkit-eos*``) and the sink
    (``streamkit-eos-pg``, ``streamkit-eos-delta``) of the contender, made here."""
    if contender not in ("streamkit-out", "streamkit-eos", "streamkit-eos-pg", "streamkit-eos-delta"):
        return None, None
    from streamkit.testing import create_topic

    name = create_topic(a.bootstrap, f"{app.name}-out", a.partitions)
    out = app.topic(name, key_serde="raw")
    if contender == "streamkit-eos-pg":
        import psycopg

        from streamkit.sinks.postgres import PostgresSink

        dsn, table = os.environ["BENCH_PG_DSN"], app.name.replace("-", "_")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {table} (key text PRIMARY KEY, n bigint, total bigint)")
        return out, app.sink("pg", PostgresSink(dsn, table, key=["key"]))
    if contender == "streamkit-eos-delta":
        from streamkit.sinks.delta import DeltaSink

        return out, app.sink("delta", DeltaSink(str(Path(a.workdir) / "delta"), key=["key"]))
    return out, None


def leave_stores_unwritten() -> None:
    """``streamkit-nowrite``: each checkpoint builds its RocksDB batch as always (every
    changed value serialised into it and into the changelog's records, which are sent),
    then drops it instead of writing it. Not a job anyone should run (its stores stay
    empty, so the harness has no totals to check): the most that any store written off the
    interpreter's lock could give, the write's whole cost on the job's thread being gone."""

    def drop(store: RocksDBStore, batch: Any, checkpoint: Any) -> None:
        store._checkpoint_bytes = checkpoint.to_bytes()

    RocksDBStore._write = drop  # type: ignore[method-assign]


def leave_state_out() -> None:
    """``streamkit-nostate``: each checkpoint writes none of the changed keys (an empty
    store batch, no changelog records) while its positions, changelog markers, progress
    records and offset commits go as always, and its caches let keys go as always. Not a
    job (its stores stay empty, so the harness has no totals to check, and a key read
    again after it left the cache is found missing, at the price of a read of an empty
    store): more than any checkpoint taken off the job's thread, by whatever means, could
    give."""

    def forget(self: ProcessorState, add: Any) -> PreparedCommit:
        return self.store.prepare({})

    ProcessorState.prepare_commit = forget  # type: ignore[method-assign]


def stored_stats(app: streamkit.App, processors: int) -> Iterator[Any]:
    """Every processor's ``stats`` values, read back from the stores after the worker
    closed them, one at a time: at 10M keys, a list of them is a gigabyte."""
    for pid in range(processors):
        with RocksDBStore.open(str(app.store_path(pid)), ["stats"]) as store:
            yield from (orjson.loads(v) for _, v in store.items("stats"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> None:
    while True:
        time.sleep(1.0)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                answer.read()
        except OSError:  # not serving yet, or stopped
            pass


if __name__ == "__main__":
    main()
