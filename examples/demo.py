"""The README's first command: the example app on the embedded broker, checked.

Starts the embedded broker, produces 20,000 generated orders (one in 500 malformed),
runs two worker processes of `examples.orders:app`, waits until the group has consumed
everything, shows `streamkit status`, stops the workers, reads their stores back and
checks every customer's totals against a reference computed from the same orders.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from rich.console import Console
from rich.table import Table

from examples.order_producer import expected_totals, produce
from stores.rocksdb import RocksDBStore
from stores.serde import StrSerde
from streamkit.broker import EmbeddedBroker
from streamkit.testing import create_topic, read_topic
from streamkit.windows import WindowKeySerde

ORDERS, CUSTOMERS, SEED, START_MS = 20_000, 200, 7, 1_767_225_600_000
ROOT = Path(__file__).resolve().parents[1]
console = Console()


async def committed_total(bootstrap: str, group: str, partitions: int) -> int:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await c.start()
    try:
        return sum([await c.committed(TopicPartition("orders", p)) or 0 for p in range(partitions)])
    finally:
        await c.stop()


def main() -> None:
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as state_dir:
        console.print(f"[bold]embedded broker[/] at {broker.bootstrap}")
        create_topic(broker.bootstrap, "orders", 4)
        create_topic(broker.bootstrap, "big-orders", 2)
        asyncio.run(produce(broker.bootstrap, "orders", ORDERS, CUSTOMERS, SEED, START_MS))
        console.print(f"produced {ORDERS} orders for {CUSTOMERS} customers (1 in 500 malformed)")
        env = dict(
            os.environ,
            STREAMKIT_BROKER=broker.bootstrap,
            STREAMKIT_STATE_DIR=state_dir,
            STREAMKIT_SESSION_TIMEOUT_MS="4000",
            PYTHONPATH=str(ROOT),
        )
        cmd = [sys.executable, "-m", "streamkit.cli", "worker", "examples.orders:app", "--log-level", "WARNING"]
        workers = [subprocess.Popen(cmd, cwd=ROOT, env=env) for _ in range(2)]
        console.print("started 2 workers: [cyan]streamkit worker examples.orders:app[/]")
        t0 = time.monotonic()
        while asyncio.run(committed_total(broker.bootstrap, "streamkit-orders-demo", 4)) < ORDERS:
            if any(w.poll() is not None for w in workers):
                sys.exit("a worker exited early; see its output above")
            if time.monotonic() - t0 > 120:
                sys.exit("the workers did not finish within 120 s")
            time.sleep(0.2)
        console.print(f"all {ORDERS} orders consumed in {time.monotonic() - t0:.1f} s\n")
        subprocess.run(
            [sys.executable, "-m", "streamkit.cli", "status", "examples.orders:app"], cwd=ROOT, env=env, check=True
        )
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(30)

        totals: dict[str, dict[str, int]] = {}
        revenue: dict[tuple[str, int], int] = {}
        wkeys = WindowKeySerde(StrSerde())
        for pid in range(4):
            path = Path(state_dir) / "orders-demo" / f"processor-{pid}"
            with RocksDBStore.open(str(path), ["customer_totals", "revenue_per_minute"]) as store:
                totals.update({k.decode(): orjson.loads(v) for k, v in store.items("customer_totals")})
                revenue.update({wkeys.loads(k): orjson.loads(v) for k, v in store.items("revenue_per_minute")})
        big = read_topic(broker.bootstrap, "big-orders")

    exp_totals, exp_revenue, bad = expected_totals(ORDERS, CUSTOMERS, SEED, START_MS)
    top = Table(title="top customers (from the processors' RocksDB stores)")
    for col in ("customer", "orders", "amount"):
        top.add_column(col, justify="right")
    for customer, t in sorted(totals.items(), key=lambda kv: -kv[1]["amount"])[:5]:
        top.add_row(customer, str(t["orders"]), f"{t['amount'] / 100:,.2f}")
    console.print(top)
    best = max(totals, key=lambda c: totals[c]["amount"])
    minutes = Table(title=f"revenue per minute of {best} (tumbling window table)")
    minutes.add_column("minute starting (UTC)")
    minutes.add_column("amount", justify="right")
    for (customer, start), cents in sorted(revenue.items()):
        if customer == best:
            minutes.add_row(time.strftime("%Y-%m-%d %H:%M", time.gmtime(start / 1000)), f"{cents / 100:,.2f}")
    console.print(minutes)
    ok = totals == exp_totals and revenue == exp_revenue
    mark = "[bold green]OK[/]" if ok else "[bold red]MISMATCH[/]"
    console.print(
        f"{mark}: {len(totals)} customers' totals and {len(revenue)} windows equal the "
        f"reference computed from the generated orders; {bad} malformed orders went to "
        f"orders-demo-dead-letters; {len(big)} big orders were sent to big-orders"
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
