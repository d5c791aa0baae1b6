"""A global table (``streamkit.joins``): its catch-up from the topic, and lookups, same run.

    python -m benchmarks.global_lookups [--keys 100000,1000000] [--lookups 500000]

On one embedded broker, per key count: write a topic of that many products (4
partitions), then read it into a global table's store as a worker does before its
processors start (records/s, seconds); then look up random keys, present and missing,
through ``GlobalTable.get`` (what a handler calls) and, as the peer measured in the same
run, in a Python dict holding every decoded value (faust's in-memory global table; the
most a lookup in the worker's heap can cost less). Prints lookups/s and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def _lookups_per_second(get: Any, keys: list[str]) -> float:
    t0 = time.perf_counter()
    for k in keys:
        get(k)
    return len(keys) / (time.perf_counter() - t0)


async def measure(bootstrap: str, keys: int, lookups: int, workdir: Path) -> dict[str, float]:
    import streamkit
    from streamkit.joins.global_store import GlobalStores
    from streamkit.kafkaio import KafkaIO
    from streamkit.testing import aproduce_json

    topic = f"products-{uuid.uuid4().hex[:8]}"
    async with KafkaIO(bootstrap) as io:
        await io.create_topic(topic, 4)
        await aproduce_json(bootstrap, topic, ((f"p{i}", {"price": i, "name": f"product {i}"}) for i in range(keys)))
        app = streamkit.App(f"lookups-{uuid.uuid4().hex[:8]}")
        table = app.global_table("products", source=topic)
        stores = GlobalStores([table], workdir / app.name)
        try:
            t0 = time.perf_counter()
            await stores.catch_up(io)
            catch_up = time.perf_counter() - t0
            assert len(table) == keys, (len(table), keys)
            rng = random.Random(1)
            present = [f"p{rng.randrange(keys)}" for _ in range(lookups)]
            missing = [f"q{rng.randrange(keys)}" for _ in range(lookups)]
            in_heap = {f"p{i}": {"price": i, "name": f"product {i}"} for i in range(keys)}
            assert all(table.get(k) == in_heap[k] for k in present[:1000])
            return {
                "catch_up_s": catch_up,
                "catch_up_rps": keys / catch_up,
                "get": _lookups_per_second(table.get, present),
                "get_missing": _lookups_per_second(table.get, missing),
                "dict": _lookups_per_second(in_heap.get, present),
                "dict_missing": _lookups_per_second(in_heap.get, missing),
            }
        finally:
            stores.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.global_lookups", description=__doc__.split("\n")[0])
    parser.add_argument("--keys", default="100000,1000000", help="comma list of key counts")
    parser.add_argument("--lookups", type=int, default=500_000)
    args = parser.parse_args()
    from streamkit.broker import EmbeddedBroker

    rows = []
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="sk-global-") as tmp:
        for n in (int(k) for k in args.keys.split(",")):
            print(f"{n:,} keys: writing the topic, reading it into a global table, looking up ...", flush=True)
            rows.append((n, asyncio.run(measure(broker.bootstrap, n, args.lookups, Path(tmp) / str(n)))))
    out = Table(title=f"global table: catch-up and lookups ({args.lookups:,} random keys each)")
    for col in ("keys", "catch-up s", "catch-up records/s", "get/s (present)", "dict get/s", "ratio",
                "get/s (missing)", "dict get/s (missing)", "ratio (missing)"):  # fmt: skip
        out.add_column(col, justify="right")
    for n, m in rows:
        out.add_row(
            f"{n:,}", f"{m['catch_up_s']:.2f}", f"{m['catch_up_rps']:,.0f}", f"{m['get']:,.0f}", f"{m['dict']:,.0f}",
            f"{m['get'] / m['dict']:.2f}x", f"{m['get_missing']:,.0f}", f"{m['dict_missing']:,.0f}",
            f"{m['get_missing'] / m['dict_missing']:.2f}x",
        )  # fmt: skip
    Console(width=None if Console().is_terminal else 160).print(out)


if __name__ == "__main__":
    main()
