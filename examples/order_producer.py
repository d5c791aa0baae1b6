"""Generate orders: `python -m examples.order_producer --orders N [--customers C] [--seed S]`.

Deterministic for a given seed, so a run can be checked against `expected_totals`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
from collections.abc import Iterator
from typing import Any

from streamkit.producer import Producer

ITEMS = ("coffee", "tea", "cake", "sandwich", "laptop", "headphones")


def generate(n: int, customers: int, seed: int, start_ms: int) -> Iterator[tuple[str, dict[str, Any], int]]:
    """Yield (customer, order, timestamp_ms): ~3 minutes of orders, one in 500 malformed."""
    rnd = random.Random(seed)
    for i in range(n):
        customer = f"customer-{rnd.randrange(customers):04d}"
        item = rnd.choice(ITEMS)
        amount = rnd.randrange(100, 100_000) if item in ("laptop", "headphones") else rnd.randrange(100, 2_000)
        order: dict[str, Any] = {"amount": amount, "item": item, "n": i}
        if i % 500 == 499:
            order = {"amount": "not-a-number", "item": item, "n": i}
        yield customer, order, start_ms + (i * 180_000) // n


def expected_totals(
    n: int, customers: int, seed: int, start_ms: int
) -> tuple[dict[str, dict[str, int]], dict[tuple[str, int], int], int]:
    totals: dict[str, dict[str, int]] = {}
    revenue: dict[tuple[str, int], int] = {}
    bad = 0
    for customer, order, ts in generate(n, customers, seed, start_ms):
        if not isinstance(order["amount"], int):
            bad += 1
            continue
        t = totals.setdefault(customer, {"orders": 0, "amount": 0})
        t["orders"] += 1
        t["amount"] += order["amount"]
        key = (customer, ts - ts % 60_000)
        revenue[key] = revenue.get(key, 0) + order["amount"]
    return totals, revenue, bad


async def produce(bootstrap: str, topic: str, n: int, customers: int, seed: int, start_ms: int) -> None:
    """Through streamkit's producer: each order lands where the topic's layout places its
    customer (a plain Kafka producer would spread them over reserved partitions too)."""
    async with Producer(bootstrap) as producer:
        for customer, order, ts in generate(n, customers, seed, start_ms):
            await producer.send(topic, customer, order, timestamp_ms=ts)
        await producer.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--broker", default=os.environ.get("STREAMKIT_BROKER"))
    parser.add_argument("--topic", default="orders")
    parser.add_argument("--orders", type=int, default=10_000)
    parser.add_argument("--customers", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--start-ms", type=int, default=1_767_225_600_000)  # 2026-01-01T00:00Z
    a = parser.parse_args()
    if not a.broker:
        parser.error("no broker: give --broker or set STREAMKIT_BROKER")
    asyncio.run(produce(a.broker, a.topic, a.orders, a.customers, a.seed, a.start_ms))
    print(f"produced {a.orders} orders for {a.customers} customers to {a.topic}")


if __name__ == "__main__":
    main()
