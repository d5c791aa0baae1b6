"""A per-customer spend total: the app of the README's "Backfill from history" guide.

`python -m examples.purchases --history history.parquet` writes a deterministic run of
purchases to the topic ``purchases`` (through streamkit's producer, so each lands where
the topic's layout places its customer) and exports the first part of it as Parquet,
with each record's partition and offset, as a data lake export of the topic would be.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
from typing import Any

import streamkit
from streamkit.producer import Producer

app = streamkit.App("purchases")  # processors: the topic's initial partition count
purchases = app.topic("purchases")
spent = app.table("spent", default=dict)


@app.processor(purchases)
def on_purchase(customer: str, purchase: dict[str, Any], ctx: streamkit.Context) -> None:
    s = spent[customer]
    spent[customer] = {"purchases": s.get("purchases", 0) + 1, "amount": s.get("amount", 0) + purchase["amount"]}


async def _write(bootstrap: str, n: int, customers: int, exported: int, seed: int) -> list[dict[str, Any]]:
    """Send ``n`` purchases; returns the first ``exported`` with their partition and offset."""
    rnd = random.Random(seed)
    rows: list[dict[str, Any]] = []
    async with Producer(bootstrap) as producer:
        pending = []
        for i in range(n):
            customer = f"customer-{rnd.randrange(customers):05d}"
            amount = rnd.randrange(1, 500)
            delivery = await producer.send(purchases.name, customer, {"amount": amount})
            if i < exported:
                pending.append((customer, amount, delivery))
        await producer.flush()
        for customer, amount, delivery in pending:
            meta = await delivery
            rows.append({"customer": customer, "amount": amount, "partition": meta.partition, "offset": meta.offset})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", required=True, help="Parquet file of the exported part")
    parser.add_argument("--purchases", type=int, default=40_000)
    parser.add_argument("--exported", type=int, default=30_000, help="how many of the first go to the export")
    parser.add_argument("--customers", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    bootstrap = os.environ.get("STREAMKIT_BROKER")
    if not bootstrap:
        raise SystemExit("set STREAMKIT_BROKER")
    rows = asyncio.run(_write(bootstrap, args.purchases, args.customers, args.exported, args.seed))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), args.history)
    print(f"{args.purchases:,} purchases in Kafka, the first {len(rows):,} exported to {args.history}")


if __name__ == "__main__":
    main()
