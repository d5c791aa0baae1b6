"""streamkit contender with windows: per key and window, count and sum of `amount`, and
a close callback per window (which counts the closes; it sends nothing, as quixstreams'
``.final()`` without a sink).

    BENCH_CONTENDER=streamkit-hopping python -m benchmarks.contenders.streamkit_windows_app \
        --bootstrap B --topic T --records N --partitions P --workdir DIR --session-timeout-ms MS

The kind comes from ``BENCH_CONTENDER`` (``streamkit-tumbling``, ``-hopping``,
``-session``, ``-count``, ``-sliding``; ``WINDOWS`` below), over the records' Kafka
timestamps (the harness's input is written in a few seconds, so the windows are short: a
second, ten seconds hopping by one, half a second of inactivity, ten records, records
half a second apart). Otherwise as the
plain ``streamkit`` contender: one worker hosting every processor, default settings
(changelog on). ``check`` is omitted (a window's totals are not the key's); the record
count is the harness's check that the work was done.
"""

# First: importing benchmarks.contenders takes PROCESS_START, before any heavy import.
from benchmarks.contenders import PROCESS_START, emit_result, parse_args

# isort: split
import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

import streamkit
from streamkit.runtime.worker import Worker
from streamkit.windows import Count, Hopping, Session, Sliding, Tumbling

WINDOWS = {
    "streamkit-tumbling": Tumbling(1, grace=0),
    "streamkit-hopping": Hopping(10, 1, grace=0),
    "streamkit-session": Session(0.5, grace=0, merge=lambda a, b: [a[0] + b[0], a[1] + b[1]]),
    "streamkit-count": Count(10),
    "streamkit-sliding": Sliding(0.5, grace=0, reduce=lambda a, b: [a[0] + b[0], a[1] + b[1]]),
}


def main() -> None:
    a = parse_args(prog="benchmarks.contenders.streamkit_windows_app")
    contender = os.environ.get("BENCH_CONTENDER", "streamkit-hopping")
    app = streamkit.App(
        f"bench-{uuid.uuid4().hex[:8]}",
        broker=a.bootstrap,
        state_dir=Path(a.workdir) / "state",
        session_timeout_ms=a.session_timeout_ms,
    )
    source = app.topic(a.topic, key_serde="raw")
    per_window = app.table("per_window", key_serde="raw", default=lambda: [0, 0], window=WINDOWS[contender])
    progress = {"n": 0, "first": 0.0, "last": 0.0, "closes": 0}
    sliding = isinstance(per_window.window, Sliding)
    target = a.records
    worker = Worker(app, 1)

    @app.processor(source)
    def count_and_sum(key: bytes, value: Any, ctx: streamkit.Context) -> None:
        amount = value["amount"]
        if sliding:
            per_window.add(key, [1, amount])
        else:
            per_window.update(key, lambda s: [s[0] + 1, s[1] + amount])
        n = progress["n"] = progress["n"] + 1
        if n == 1:
            progress["first"] = time.time()
        elif n == target:
            progress["last"] = time.time()
            worker.stop()

    @app.on_window_close(per_window)
    def closed(key: bytes, window: streamkit.Window, totals: Any, ctx: streamkit.Context) -> None:
        progress["closes"] += 1

    asyncio.run(worker.run())
    emit_result(
        records=progress["n"],
        first_record_at=progress["first"],
        last_record_at=progress["last"],
        process_start=PROCESS_START,
        windows_closed=progress["closes"],
    )


if __name__ == "__main__":
    main()
