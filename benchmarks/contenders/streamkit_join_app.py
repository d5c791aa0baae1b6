"""streamkit contenders with a second input: the plain job's count and sum of `amount`
per key, plus

- ``streamkit-merged``: a table fed by an empty topic (``app.table(..., source=)``), so
  that every processor reads two topics and each record goes through the time-ordered
  merge (held, then released in timestamp order): the merge's cost, nothing else;
- ``streamkit-join``: a table fed by a topic of 10,000 customers (keys ``key-0`` ...
  ``key-9999``, written before the run with timestamp 1 ms), read by the handler as of
  each record's time: a stream-table join (at 10k keys, every record finds its customer);
- ``streamkit-sjoin``: a windowed stream-stream join (``@app.join``) of the input with
  the same 10,000 customers as a stream, ``within`` wide enough that every record meets
  its key's customer: each record is buffered (a windowed table) and paired once.

    python -m benchmarks.contenders.streamkit_join_app --bootstrap B --topic T --records N \
        --partitions P --workdir DIR --session-timeout-ms MS

Records/s count the input topic's records (the customers' 10,000 are applied too, first:
the merge takes them by timestamp). ``joined``: records that found their customer.
"""

# First: importing benchmarks.contenders takes PROCESS_START, before any heavy import.
from benchmarks.contenders import PROCESS_START, check_totals, emit_result, parse_args

# isort: split
import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

import streamkit
from benchmarks.contenders.streamkit_app import stored_stats
from streamkit.runtime.worker import Worker
from streamkit.testing import create_topic, produce_json

CUSTOMERS = 10_000


def main() -> None:
    a = parse_args(prog="benchmarks.contenders.streamkit_join_app")
    contender = os.environ.get("BENCH_CONTENDER", "streamkit-join")
    tag = uuid.uuid4().hex[:8]
    customers_topic = create_topic(a.bootstrap, f"bench-customers-{tag}", a.partitions)
    if contender in ("streamkit-join", "streamkit-sjoin"):
        produce_json(
            a.bootstrap, customers_topic,
            [(b"key-%d" % k, {"tier": k % 5}, None, 1) for k in range(CUSTOMERS)],
        )  # fmt: skip
    app = streamkit.App(
        f"bench-{tag}",
        broker=a.bootstrap,
        state_dir=Path(a.workdir) / "state",
        session_timeout_ms=a.session_timeout_ms,
    )
    source = app.topic(a.topic, key_serde="raw")
    stream_join = contender == "streamkit-sjoin"
    customers_source = app.topic(customers_topic, key_serde="raw")
    table = None if stream_join else app.table("customers", source=customers_source)
    customers = table if contender == "streamkit-join" else None  # streamkit-merged: never read
    stats = app.table("stats", key_serde="raw", default=lambda: [0, 0])
    progress = {"n": 0, "joined": 0, "first": 0.0, "last": 0.0, "cpu_first": 0.0, "cpu_last": 0.0}
    target = a.records
    worker = Worker(app, 1)

    if stream_join:  # customers at 1 ms, the input at its production time: within ~300 years

        @app.join(customers_source, source, within=1e10)
        def paired(key: bytes, customer: Any, record: Any, ctx: streamkit.Context) -> None:
            progress["joined"] += 1

    @app.processor(source)
    def count_and_sum(key: bytes, value: Any, ctx: streamkit.Context) -> None:
        if customers is not None and customers.get(key) is not None:
            progress["joined"] += 1
        s = stats[key]
        stats[key] = [s[0] + 1, s[1] + value["amount"]]
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
        check=check_totals(stored_stats(app, a.partitions)),
        cpu_window_s=progress["cpu_last"] - progress["cpu_first"],
        joined=progress["joined"],
    )


if __name__ == "__main__":
    main()
