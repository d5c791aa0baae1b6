"""A table fed by a topic and a stream-table join, in real worker processes on the real
broker, against a reference computed here: each order is joined with its customer as of
the order's timestamp (customers' updates in time order, orders late and out of order).

The same answer whatever the fetches deliver first (every record produced before the
worker starts: the merge waits for the topic that lags; or produced while it runs, each
span's orders before its customers: the idle wait holds them), after kill -9 at random
moments, from a store rebuilt on a fresh state directory, and through processor scaling
2 -> 3 -> 2 under load."""

from __future__ import annotations

import bisect
import random
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from stores.rocksdb import RocksDBStore
from stores.serde import serde_for
from streamkit.testing import create_topic, produce_json, read_topic
from tests.runtime.jobs import Job, wait_for_log, wait_until_committed

CUSTOMERS, SPANS, UPDATES_PER_SPAN, ORDERS_PER_SPAN = 60, 2, 150, 400
T0 = 1_700_000_000_000
SPAN_MS = 60_000
HEARTBEATS = ("hb-0", "hb-2")
"""Customers keyed to partitions 1 and 0 (of 2): one per processor."""
UPDATES = SPANS * (UPDATES_PER_SPAN + len(HEARTBEATS))
Expected = tuple[dict[str, Any], dict[str, list[int]], dict[str, Any]]
"""(order id -> level as of its time, customer -> [orders, sum of levels], customer -> latest)."""


def _history(seed: int) -> tuple[list[list[tuple[str, Any, None, int]]], list[list[tuple[str, Any, None, int]]]]:
    """Per span, the customers' updates (in time order, some tombstones) and the orders
    (keyed by customer; timestamps anywhere in the spans so far: late and out of order)."""
    rng = random.Random(seed)
    updates, orders = [], []
    for s in range(SPANS):
        start = T0 + s * SPAN_MS
        stamps = sorted(rng.randrange(start, start + SPAN_MS) for _ in range(UPDATES_PER_SPAN))
        values = [None if rng.random() < 0.1 else {"level": rng.randrange(1, 1000)} for _ in stamps]
        updates.append([(f"c{rng.randrange(CUSTOMERS)}", v, None, ts) for v, ts in zip(values, stamps, strict=True)])
        # the span's last customer update in each partition: the table's topic says its time
        # has passed (as a regularly updated table does), so no order of the span waits for
        # it at the end and the next span's orders wait for its customers afresh
        updates[-1] += [(key, {"level": 0}, None, start + SPAN_MS - 1) for key in HEARTBEATS]
        orders.append([
            (f"c{rng.randrange(CUSTOMERS)}", {"id": f"o{s}-{j}"}, None, rng.randrange(T0, start + SPAN_MS))
            for j in range(ORDERS_PER_SPAN)
        ])  # fmt: skip
    return updates, orders


def _reference(updates: list[Any], orders: list[Any]) -> Expected:
    """(order id -> level as of its time, customer -> [orders, sum of levels], customer -> latest)."""
    versions: dict[str, list[tuple[int, Any]]] = {}
    for key, value, _, ts in (u for span in updates for u in span):  # in time order
        versions.setdefault(key, []).append((ts, None if value is None else value["level"]))
    joined: dict[str, Any] = {}
    totals: dict[str, list[int]] = {}
    for key, order, _, ts in (o for span in orders for o in span):
        kept = versions.get(key, [])
        i = bisect.bisect_right([t for t, _ in kept], ts)
        level = kept[i - 1][1] if i else None
        joined[order["id"]] = level
        n, total = totals.get(key, [0, 0])
        totals[key] = [n + 1, total + (level or 0)]
    latest = {k: v[-1][1] for k, v in versions.items() if v[-1][1] is not None}
    return joined, totals, latest


def _outputs(broker: str, topic: str) -> dict[str, set[Any]]:
    seen: dict[str, set[Any]] = {}
    for r in read_topic(broker, topic):
        seen.setdefault(r.key.decode(), set()).add(orjson.loads(r.value)["level"])
    return seen


def _stores(job: Job, processors: int) -> tuple[dict[str, list[int]], dict[str, Any]]:
    json, fed = serde_for("json"), None
    totals: dict[str, list[int]] = {}
    latest: dict[str, Any] = {}
    from streamkit.joins.fed_table import VersionsSerde

    fed = VersionsSerde(json)
    for pid in range(processors):
        path = job.state_dir / job.app / f"processor-{pid}"
        with RocksDBStore.open(str(path), ["totals", "customers"]) as store:
            totals.update((k.decode(), json.loads(v)) for k, v in store.items("totals"))
            for k, v in store.items("customers"):
                last = fed.loads(v)[-1][1]
                if last is not None:
                    latest[k.decode()] = last["level"]
    return totals, latest


def _topics(broker: str, tag: str) -> tuple[str, str, str]:
    return (
        create_topic(broker, f"orders-{tag}", 2),
        create_topic(broker, f"customers-{tag}", 2),
        create_topic(broker, f"joined-{tag}", 2),
    )


def _check(
    job: Job, broker: str, out: str, expected: tuple[dict[str, Any], dict[str, list[int]], dict[str, Any]]
) -> None:
    joined, totals, latest = expected
    seen = _outputs(broker, out)
    wrong = {k: (v, joined.get(k)) for k, v in seen.items() if v != {joined.get(k)}}
    assert not wrong, (
        f"{len(wrong)} orders joined otherwise than as of their time (seen, expected): {list(wrong.items())[:10]}"
    )
    assert set(seen) == set(joined)
    got_totals, got_latest = _stores(job, 2)
    assert got_totals == totals, {k: (v, totals.get(k)) for k, v in got_totals.items() if v != totals.get(k)}
    assert got_latest == latest, {k: (v, latest.get(k)) for k, v in got_latest.items() if v != latest.get(k)}


def test_orders_join_their_customer_as_of_their_time_through_kills_and_a_rebuild(broker: str, tmp_path: Path) -> None:
    """Every record there before the worker starts; kill -9 twice at random moments; then
    the stores rebuilt from the input on a fresh state directory."""
    tag = uuid.uuid4().hex[:8]
    orders_topic, customers_topic, out = _topics(broker, tag)
    updates, orders = _history(seed=13)
    produce_json(broker, customers_topic, [u for span in updates for u in span])
    produce_json(broker, orders_topic, [o for span in orders for o in span])
    job = Job(broker, f"fed-{tag}", orders_topic, tmp_path / "state", processors=2, app_spec="tests.joins.fed_app:app")
    # no changelog: the fresh state directory at the end is rebuilt from the input
    env = {"SK_TEST_CUSTOMERS": customers_topic, "SK_TEST_OUT": out, "STREAMKIT_CHANGELOG": "false"}
    total = SPANS * ORDERS_PER_SPAN
    rng = random.Random(2)
    job.kill_at_random_moments(rng, 2, total // 2, **env)
    worker = job.start_worker(**env)
    try:
        wait_for_log(job, worker, "hosts processors")  # (the killed ones may have applied everything)
        wait_until_committed(job, 2, total)
        wait_until_committed(job, 2, UPDATES, topic=customers_topic)  # its last may wait
    finally:
        job.stop_all()
    expected = _reference(updates, orders)
    _check(job, broker, out, expected)
    # a fresh state directory: the stores are rebuilt from the input, in the same order
    shutil.rmtree(job.state_dir)
    worker = job.start_worker(**env)
    try:
        wait_for_log(job, worker, "hosts processors")
        assert "rebuilt from" in job.log(worker)
        wait_until_committed(job, 2, total)
    finally:
        job.stop_all()
    _check(job, broker, out, expected)


def test_the_idle_wait_holds_orders_for_customers_produced_just_after_them(broker: str, tmp_path: Path) -> None:
    """Produced live, each span's orders a moment before its customers: with
    ``max_task_idle_ms`` the worker waits for them, and joins as when all was there first."""
    tag = uuid.uuid4().hex[:8]
    orders_topic, customers_topic, out = _topics(broker, tag)
    updates, orders = _history(seed=11)
    job = Job(broker, f"fed-{tag}", orders_topic, tmp_path / "state", processors=2, app_spec="tests.joins.fed_app:app")
    job.start_worker(SK_TEST_CUSTOMERS=customers_topic, SK_TEST_OUT=out, STREAMKIT_MAX_TASK_IDLE_MS="3000")
    try:
        done = 0
        for span_updates, span_orders in zip(updates, orders, strict=True):
            produce_json(broker, orders_topic, span_orders)
            time.sleep(0.3)
            produce_json(broker, customers_topic, span_updates)
            done += len(span_orders)
            wait_until_committed(job, 2, done)
        wait_until_committed(job, 2, UPDATES, topic=customers_topic)  # its last may wait
    finally:
        job.stop_all()
    _check(job, broker, out, _reference(updates, orders))


def test_the_join_holds_through_processor_scaling_under_load(broker: str, tmp_path: Path) -> None:
    """Two workers, 2 -> 3 -> 2 processors while customers and orders are written (each
    span's customers first, then its orders): the table's versions move with their keys."""
    tag = uuid.uuid4().hex[:8]
    orders_topic, customers_topic, out = _topics(broker, tag)
    updates, orders = _history(seed=17)
    job = Job(broker, f"fed-{tag}", orders_topic, tmp_path / "state", processors=2, app_spec="tests.joins.fed_app:app")
    env = {"SK_TEST_CUSTOMERS": customers_topic, "SK_TEST_OUT": out}

    def produce(span: int) -> None:
        produce_json(broker, customers_topic, updates[span])
        produce_json(broker, orders_topic, orders[span])

    said = ""
    workers = [job.start_worker(**env), job.start_worker(**env)]
    try:
        for worker in workers:
            wait_for_log(job, worker, "hosts processors")
        for span, processors in enumerate((3, 2)):
            with ThreadPoolExecutor(1) as pool:  # written while the job scales
                writing = pool.submit(produce, span)
                said += job.scale(processors, **env)
                writing.result()
            wait_until_committed(job, 2, (span + 1) * ORDERS_PER_SPAN)
        wait_until_committed(job, 2, UPDATES, topic=customers_topic)
        gone = [job.state_dir / job.app / name for name in ("processor-2", "processor-0.receiving")]
        deadline = time.monotonic() + 60
        while any(path.exists() for path in gone):  # the shrink done: processor 2's keys are in 0's store
            assert time.monotonic() < deadline, job.log(workers[0], 3000)
            time.sleep(0.2)
    finally:
        job.stop_all()
    assert "processor 2: takes over the keys of processor 0" in said and "processor 2: retires" in said, said
    _check(job, broker, out, _reference(updates, orders))
