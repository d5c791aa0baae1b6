"""Global tables in a real worker process on the real broker: a table of 100,000
products is read whole before the first order is applied, then followed while the
worker runs (updates, tombstones, a new key). That a restart reads on from where the
copy was is tests/joins/test_global_store.py's."""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from stores.rocksdb import RocksDBStore
from stores.serde import serde_for
from streamkit.kafkaio import KafkaIO
from streamkit.runtime.status import STATUS_TOPIC, decode_status
from streamkit.testing import create_topic, produce_json
from tests.runtime.jobs import ROOT, Job, wait_for_log, wait_until_committed

PRODUCTS = 100_000


def _state(job: Job, processors: int) -> dict[str, Any]:
    values = serde_for("json")
    out: dict[str, Any] = {}
    for pid in range(processors):
        with RocksDBStore.open(str(job.state_dir / job.app / f"processor-{pid}"), ["enriched"]) as store:
            out.update((k.decode(), values.loads(v)) for k, v in store.items("enriched"))
    return out


def _global_keys(bootstrap: str, app: str) -> int | None:
    """The keys of products the app's running worker last said it held (None: no word yet)."""

    async def read() -> int | None:
        async with KafkaIO(bootstrap) as io:
            records = await io.read_topic(STATUS_TOPIC)
        said = [s for r in records if (s := decode_status(r.value, app)) is not None and s.alive]
        return said[-1].global_tables["products"]["keys"] if said and said[-1].global_tables else None

    return asyncio.run(read())


def _worker_id(job: Job, worker: Any) -> str:
    """The worker's client id, as its heartbeats name it (``APP-PID-...``)."""
    found = re.search(rf"\b({re.escape(job.app)}-{worker.pid}-[0-9a-f]+)-m0\b", job.log(worker))
    assert found, job.log(worker, 3000)
    return found.group(1)


def _caught_up_line(job: Job, worker: Any) -> int:
    found = re.findall(r"global table 'products' caught up with \S+ in [\d.]+ s: (\d+) records read", job.log(worker))
    assert found, job.log(worker, 3000)
    return int(found[-1])


def test_a_global_table_is_read_before_processing_and_followed_live(broker: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    products_topic = create_topic(broker, f"products-{tag}", 2)
    orders_topic = create_topic(broker, f"orders-{tag}", 2)
    job = Job(broker, f"global-{tag}", orders_topic, tmp_path / "state", processors=2,
              app_spec="tests.joins.global_app:app")  # fmt: skip
    extra = {"SK_TEST_PRODUCTS": products_topic}
    rng = random.Random(7)
    price = {f"p{i}": i for i in range(PRODUCTS)}
    produce_json(broker, products_topic, [(k, {"price": v}) for k, v in price.items()])
    first = [(f"o{j}", {"product": f"p{rng.randrange(PRODUCTS)}"}) for j in range(300)]
    produce_json(broker, orders_topic, first)
    changed = rng.sample(sorted(price), 60)
    worker = job.start_worker(**extra)
    try:
        # 1. every product is held before the first order is applied (each order says how many it saw)
        wait_until_committed(job, 2, len(first))

        # 2. followed while the worker runs: 40 new prices, 20 tombstones and a new product;
        # once its copy holds them (its status says so), the orders for them see them
        for k in changed[:40]:
            price[k] += 1_000_000
        for k in changed[40:]:
            del price[k]
        price["p-new"] = 5
        updates: list[tuple[str, Any]] = [(k, {"price": price[k]}) for k in changed[:40]]
        updates += [(k, None) for k in changed[40:]] + [("p-new", {"price": 5})]
        produce_json(broker, products_topic, updates)
        deadline = time.monotonic() + 60
        while _global_keys(broker, job.app) != PRODUCTS - 20 + 1:
            assert worker.poll() is None and time.monotonic() < deadline, job.log(worker, 3000)
            time.sleep(0.2)
        shown = subprocess.run(
            [sys.executable, "-m", "streamkit.cli", "status", job.app_spec], env=dict(job.env(**extra), COLUMNS="200"),
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        rows = [[c.strip() for c in line.split("│")[1:-1]] for line in shown.stdout.splitlines()]
        assert ["products", _worker_id(job, worker), str(PRODUCTS - 19), "0", "-"] in rows, shown.stdout
        second = [(f"o{300 + j}", {"product": k}) for j, k in enumerate([*changed, "p-new"])]
        produce_json(broker, orders_topic, second)
        wait_until_committed(job, 2, len(first) + len(second))
    finally:
        job.stop_all()
    assert _caught_up_line(job, worker) == PRODUCTS
    state = _state(job, 2)
    assert {k: state[k]["price"] for k, _ in first} == {k: int(o["product"][1:]) for k, o in first}
    assert {state[k]["known"] for k, _ in first} == {PRODUCTS}
    assert {k: state[k]["price"] for k, _ in second} == {k: price.get(o["product"]) for k, o in second}
    assert {state[k]["known"] for k, _ in second} == {PRODUCTS - 19}
    wait_for_log(job, worker, "stopped in")
