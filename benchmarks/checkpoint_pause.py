"""How long a checkpoint stops the hot loop when many keys changed since the last one.

    python -m benchmarks.checkpoint_pause [--keys 200000] [--rounds 2] [--modes bounded,one-checkpoint]

One partition, one processor (so every changed key is in one store), the count+sum
handler; the topic holds ``--rounds`` passes over ``--keys`` distinct keys, waiting
before the worker starts. While the worker works through that backlog, the handler
notes the time of every call; a checkpoint shows as the gap between two calls. Printed
per mode: the longest gaps, the number of gaps over 5 ms (checkpoints, and any wait for a fetch) and records/s.

- ``bounded``: default settings; a checkpoint starts as soon as the processor changed
  ``checkpoint_dirty_keys`` keys (50,000), so no checkpoint writes more.
- ``one-checkpoint``: that bound and the timer off, ``commit_every`` = ``--keys``: the
  first checkpoint writes every key at once (the case the bound removes).

The figure the issue asks for is the longest gap in ``bounded`` at 200,000 changed keys;
``one-checkpoint`` beside it, in the same run, is what a single checkpoint of all of them
costs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

MODES = {
    "bounded": {},
    "one-checkpoint": {"checkpoint_dirty_keys": 1 << 40, "commit_interval": 3600.0},
}


def run_mode(bootstrap: str, topic: str, mode: str, keys: int, records: int, workdir: Path) -> dict[str, Any]:
    import streamkit
    from streamkit.runtime.worker import Worker

    settings: dict[str, Any] = dict(MODES[mode])
    if mode == "one-checkpoint":
        settings["commit_every"] = keys
    app = streamkit.App(
        f"pause-{mode}-{uuid.uuid4().hex[:6]}", broker=bootstrap, state_dir=workdir / mode, processors=1, **settings
    )
    stats = app.table("stats", key_serde="raw", default=lambda: [0, 0])
    calls: list[float] = []
    worker = Worker(app, 1)
    clock = time.perf_counter

    @app.processor(app.topic(topic, key_serde="raw"))
    def count_and_sum(key: bytes, value: Any, ctx: streamkit.Context) -> None:
        s = stats[key]
        stats[key] = [s[0] + 1, s[1] + value["amount"]]
        calls.append(clock())
        if len(calls) == records:
            worker.stop()

    asyncio.run(worker.run())
    gaps = sorted((b - a for a, b in zip(calls, calls[1:], strict=False)), reverse=True)
    return {
        "mode": mode,
        "longest_ms": [g * 1000 for g in gaps[:3]],
        "over_5ms": sum(1 for g in gaps if g > 0.005),
        "records_per_s": (len(calls) - 1) / (calls[-1] - calls[0]),
        "median_gap_us": statistics.median(gaps) * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(prog="benchmarks.checkpoint_pause")
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=2, help="passes over the keys in the input")
    ap.add_argument("--modes", default=",".join(MODES))
    a = ap.parse_args()
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {unknown}; known: {list(MODES)}")

    from streamkit.broker import EmbeddedBroker
    from streamkit.testing import create_topic, produce_json

    console = Console()
    records = a.keys * a.rounds
    rows = []
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="sk-pause-") as tmp:
        topic = create_topic(broker.bootstrap, f"pause-{uuid.uuid4().hex[:6]}", 1)
        produce_json(broker.bootstrap, topic, ((b"key-%d" % (i % a.keys), {"amount": i % 100}) for i in range(records)))
        for mode in modes:
            rows.append(run_mode(broker.bootstrap, topic, mode, a.keys, records, Path(tmp)))
    table = Table(title=f"checkpoint pauses: {a.keys:,} keys changed, {records:,} records, one processor")
    for col in ("mode", "longest gaps (ms)", "gaps > 5 ms", "median gap (µs)", "records/s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["mode"],
            ", ".join(f"{g:.1f}" for g in r["longest_ms"]),
            str(r["over_5ms"]),
            f"{r['median_gap_us']:.1f}",
            f"{r['records_per_s']:,.0f}",
        )
    console.print(table)
    by = {r["mode"]: r for r in rows}
    if "bounded" in by and "one-checkpoint" in by:
        ratio = by["bounded"]["longest_ms"][0] / by["one-checkpoint"]["longest_ms"][0]
        console.print(f"longest pause, bounded / one checkpoint of every key: {ratio:.2f}")


if __name__ == "__main__":
    main()
