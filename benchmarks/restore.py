"""A lost store brought back: from the job's changelog vs from the input, same run.

    python -m benchmarks.restore [--keys 1000000] [--records 2000000] [--partitions 4]

On one embedded broker: write the input (``--records`` records over ``--keys`` keys),
then run a worker (every processor, changelog on) over all of it: that is what a store
lost without a changelog costs, the whole input read again (records/s and seconds).
Then delete the stores and restore every processor from the changelog the run wrote
(``streamkit.state.restore``, what a worker does on taking a processor whose store is
missing): keys restored, changelog records read, seconds. Prints both and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def run_worker(bootstrap: str, topic: str, records: int, state: Path) -> tuple[Any, float]:
    """Every record through one worker from offset 0; (the app, seconds first to last)."""
    import streamkit
    from streamkit.runtime.worker import Worker

    app = streamkit.App(f"restore-{uuid.uuid4().hex[:8]}", broker=bootstrap, state_dir=state)
    source = app.topic(topic, key_serde="raw")
    stats = app.table("stats", key_serde="raw", default=lambda: [0, 0])
    worker = Worker(app, 1)
    seen = {"n": 0, "first": 0.0, "last": 0.0}

    @app.processor(source)
    def count_and_sum(key: bytes, value: Any, ctx: streamkit.Context) -> None:
        s = stats[key]
        stats[key] = [s[0] + 1, s[1] + value["amount"]]
        seen["n"] += 1
        if seen["n"] == 1:
            seen["first"] = time.perf_counter()
        if seen["n"] == records:
            seen["last"] = time.perf_counter()
            worker.stop()

    asyncio.run(worker.run())
    return app, seen["last"] - seen["first"]


async def restore_all(bootstrap: str, app: Any, partitions: int) -> tuple[int, int, float]:
    """Every processor's store from the changelog: (keys, changelog records read, seconds)."""
    from streamkit.kafkaio import KafkaIO
    from streamkit.state.changelog import changelog_topic
    from streamkit.state.restore import ChangelogSource, restore_store

    keys = read = 0
    started = time.perf_counter()
    async with KafkaIO(bootstrap) as io:
        for pid in range(partitions):
            plan = await restore_store(
                ChangelogSource(io, changelog_topic(app.name), app.tables, partitions), pid, app.store_path(pid)
            )
            assert plan is not None, f"processor {pid}: nothing in the changelog"
            keys += sum(1 for v in plan.state.get("stats", {}).values() if v is not None)
            read += plan.records + plan.skipped + plan.batches
    return keys, read, time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(prog="benchmarks.restore")
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    a = ap.parse_args()

    from benchmarks.input import InputSpec, prepare_topic
    from streamkit.broker import EmbeddedBroker

    console = Console()
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="sk-restore-") as tmp:
        topic = f"restore-in-{uuid.uuid4().hex[:6]}"
        prepare_topic(broker.bootstrap, topic, InputSpec(a.records, a.keys, a.partitions))
        state = Path(tmp) / "state"
        app, input_s = run_worker(broker.bootstrap, topic, a.records, state)
        shutil.rmtree(state)
        keys, read, restore_s = asyncio.run(restore_all(broker.bootstrap, app, a.partitions))
    table = Table(title=f"a lost store: {a.records:,} input records, {a.keys:,} keys, {a.partitions} processors")
    for col in ("from", "records read", "seconds", "records/s", "keys/s"):
        table.add_column(col, justify="right")
    table.add_row("the input", f"{a.records:,}", f"{input_s:.1f}", f"{a.records / input_s:,.0f}", "")
    table.add_row(
        "the changelog", f"{read:,}", f"{restore_s:.1f}", f"{read / restore_s:,.0f}", f"{keys / restore_s:,.0f}"
    )
    console.print(table)
    console.print(
        f"keys restored {keys:,}; restore from the changelog / from the input: {restore_s / input_s:.2f}x the time"
    )


if __name__ == "__main__":
    main()
