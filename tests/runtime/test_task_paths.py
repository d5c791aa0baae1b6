"""One task, two drivers: the live path (a consumer's fetches through admission and
``apply_fetched``, the member's step) and the history reader (``rebuild``) apply the
same records to a task and leave the same stores, positions, checkpoint and output.

The job reads two topics through the time-ordered merge (a table fed by one, read by the
other's handler), keeps a tumbling window with a close callback and reports late
records: the order the records are applied in decides every value, every close and
every dead letter. One partition per topic: the order within a topic across several
partitions is the stream-time question of the time issue, not the drivers'.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

import streamkit
from assignors.linear_hashing import bucket_modulus
from assignors.placement import KeyFilter
from streamkit.checkpoint_keys import PROCESSOR_COUNT
from streamkit.joins.merge import TimeMerge
from streamkit.kafkaio import KafkaIO
from streamkit.layout.registry import LayoutRegistry
from streamkit.layout.seal import OriginSeal
from streamkit.runtime.admission import Admission
from streamkit.runtime.dispatch import Dispatcher
from streamkit.runtime.merging import consumer_lagging
from streamkit.runtime.output import Output
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.rebuild import HistoryReader, Pace, RebuildPlan, rebuild
from streamkit.runtime.routes import Route
from streamkit.runtime.task import Task, apply_fetched
from streamkit.testdriver.capture import CaptureProducer
from streamkit.testing import create_topic, produce_json, unique_topic_name
from streamkit.windows import Tumbling

BASE_MS = 1_700_000_000_000


def make_app(orders_topic: str, customers_topic: str) -> streamkit.App:
    app = streamkit.App(unique_topic_name("task-paths"))
    orders, customers, out = app.topic(orders_topic), app.topic(customers_topic), app.topic("task-paths-out")
    names = app.table("names", default=str)
    spent = app.table("spent", default=int)
    per_10s = app.table("per_10s", default=int, window=Tumbling(10, grace=2))

    @app.processor(customers)
    def on_customer(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        names[key] = value["name"]

    @app.processor(orders)
    def on_order(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        spent[key] += value["amount"]
        per_10s[key] += value["amount"]
        ctx.send(out, key, {"seq": value["seq"], "name": names[key], "spent": spent[key]})

    @app.on_window_close(per_10s)
    def closed(key: str, window: Any, value: int, ctx: streamkit.Context) -> None:
        ctx.send(out, key, {"window": window.start, "total": value})

    return app


def write_history(broker: str, orders: str, customers: str, seed: int) -> None:
    """Customers renamed now and then, orders out of order within the grace and a few
    far behind it (late): all on one partition each, timestamps interleaved."""
    rng = random.Random(seed)
    keys = [f"c{i}" for i in range(12)]
    renames = [(k, {"name": f"{k}-v{n}"}, 0, BASE_MS + rng.randrange(0, 60_000)) for n in range(4) for k in keys]
    renames.sort(key=lambda r: r[3])
    produce_json(broker, customers, renames)
    placed = []
    for seq in range(400):
        at = BASE_MS + seq * 150 + rng.randrange(-1500, 1500)  # within the grace
        if rng.random() < 0.03:
            at -= 20_000  # behind it: late
        placed.append((rng.choice(keys), {"seq": seq, "amount": rng.randrange(1, 50)}, 0, at))
    produce_json(broker, orders, placed)


def dispatcher_for(app: streamkit.App, name: str, producer: CaptureProducer) -> Dispatcher:
    output = Output(app.name, app.dead_letter_topic, app.topics, producer, OriginSeal.ephemeral())
    return Dispatcher(
        name, app.tables, output, failure_alarm_after=1000,
        close_callbacks=app.window_close_callbacks, late_callbacks=app.late_callbacks,
    )  # fmt: skip


async def drive_live(
    app: streamkit.App, broker: str, ends: dict[TopicPartition, int], path: Path
) -> tuple[Task, list[Any]]:
    """The member's live step: a consumer's fetches, admission, ``apply_fetched``, until
    every partition is read to its end."""
    tps = list(ends)
    producer = CaptureProducer()
    dispatcher = dispatcher_for(app, "live", producer)
    proc = await ProcessorState.open(0, path, app.tables, 5.0)
    consumer = AIOKafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False, max_poll_records=37)
    await consumer.start()
    try:
        consumer.assign(tps)
        admission = Admission(consumer, group=app.group_id, name="live", seal=OriginSeal.ephemeral())
        task = Task(
            proc, dispatcher, TimeMerge(app.settings.max_task_idle_ms), consumer_lagging(consumer, lambda: admission)
        )
        for tp in tps:
            route = Route.build(proc, app.handlers[tp.topic], (tp.topic, tp.partition), 0, None)
            admission.add(tp, route)
            task.read(tp, route)
            consumer.seek(tp, 0)
        while task.merge.held or any(task.routes[tp].position < ends[tp] for tp in tps):
            fetched = await consumer.getmany(timeout_ms=200, max_records=37)  # small batches: many merges
            await apply_fetched(admission, {task.id: task}, fetched)
            await dispatcher.send_output()
        task.commit(task.checkpoint_record({}, 0, {PROCESSOR_COUNT: 1}))
    finally:
        await consumer.stop()
    return task, producer.sent


async def drive_history(
    app: streamkit.App, broker: str, ends: dict[TopicPartition, int], path: Path
) -> tuple[Task, list[Any]]:
    """The history reader: every record read to its end with output (``output_from`` 0)."""
    tps = list(ends)
    producer = CaptureProducer()
    dispatcher = dispatcher_for(app, "history", producer)
    proc = await ProcessorState.open(0, path, app.tables, 5.0)
    io = await KafkaIO(broker).start()
    registry = await LayoutRegistry(broker, io=io).start()
    try:
        await registry.load_origin_seal()
        plan = RebuildPlan(0, KeyFilter(bucket_modulus(0, 1, 1), frozenset({0})))
        plan.targets, plan.owned, plan.keyless = dict(ends), set(tps), set(tps)
        plan.output_from = dict.fromkeys(tps, 0)
        reader = HistoryReader(io, registry, app.handlers, dispatcher, app.group_id)
        task = reader.task(proc)
        pace = Pace(lambda: ({}, 0), 1 << 62, {PROCESSOR_COUNT: 1}, before_checkpoint=dispatcher.send_output)
        assert await rebuild(reader, task, plan, pace) == sum(ends.values())
    finally:
        await io.close()
    return task, producer.sent


def outputs(sent: list[Any], app: streamkit.App) -> tuple[list[Any], list[Any], list[Any]]:
    """What was sent: the handlers' records in order, the dead letters in order, the
    window closes sorted."""
    out = [(s.key, s.value) for s in sent if s.topic == "task-paths-out"]
    dead = [(s.key, s.value) for s in sent if s.topic == app.dead_letter_topic]
    assert len(out) + len(dead) == len(sent)
    return [o for o in out if b"window" not in o[1]], dead, sorted(o for o in out if b"window" in o[1])


def state_of(task: Task) -> dict[str, dict[Any, Any]]:
    return {name: dict(cache.items()) for name, cache in task.proc.caches.items()}


def test_the_live_path_and_the_history_reader_leave_a_task_alike(broker: str, tmp_path: Path) -> None:
    orders, customers = create_topic(broker, unique_topic_name("tp-orders"), 1), unique_topic_name("tp-customers")
    create_topic(broker, customers, 1)
    write_history(broker, orders, customers, seed=52)
    app = make_app(orders, customers)
    ends = {TopicPartition(orders, 0): 400, TopicPartition(customers, 0): 48}  # as written
    live, live_out = asyncio.run(drive_live(app, broker, ends, tmp_path / "live"))
    history, history_out = asyncio.run(drive_history(app, broker, ends, tmp_path / "history"))
    try:
        # the history was all applied, with something in every table and every kind of output
        assert live.proc.loaded.positions == {(orders, 0): 400, (customers, 0): 48}
        state = state_of(live)
        assert len(state["names"]) == 12 and len(state["spent"]) == 12 and state["per_10s"]
        sent = {s.topic for s in live_out}
        assert sent == {"task-paths-out", app.dead_letter_topic}, sent
        assert any(b"window" in s.value for s in live_out)  # closes
        # ... and alike through both drivers
        assert state_of(history) == state
        assert history.proc.loaded.positions == live.proc.loaded.positions
        assert history.proc.loaded.ic_ranges == live.proc.loaded.ic_ranges == {}
        assert history.proc.loaded.extra == live.proc.loaded.extra
        assert history.proc.stream_time == live.proc.stream_time > BASE_MS
        # the handlers' output and the dead letters in the same order; the same closes,
        # each once (a close goes out after the batch whose stream time passed it: where,
        # among the handlers' output, depends on how the driver cut the batches)
        assert outputs(history_out, app) == outputs(live_out, app)
    finally:
        live.close()
        history.close()
