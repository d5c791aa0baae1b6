"""A rebuild of an exactly-once reader's state (a catch-up, a scaling bootstrap, a staging
store) reads the input up to the group's position; a record just below it whose commit
marker lies beyond it was decided by the group all the same. The rebuild reads on past
its target for markers only: the record is applied, nothing past the target is, and the
markers read past it are forgotten (the processor reading on from the target reads
them again in their turn). Against the broker, with a real store."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

import streamkit
from assignors.linear_hashing import bucket_modulus
from assignors.placement import KeyFilter
from streamkit.checkpoint_keys import PROCESSOR_COUNT
from streamkit.exactly_once.markers import Attempt, commit_header, recover_header
from streamkit.exactly_once.writer import Writers
from streamkit.kafkaio import KafkaIO
from streamkit.layout.registry import LayoutRegistry
from streamkit.layout.seal import OriginSeal
from streamkit.runtime.dispatch import Dispatcher
from streamkit.runtime.output import Output
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.rebuild import HistoryReader, Pace, RebuildPlan, rebuild
from streamkit.testdriver.capture import CaptureProducer
from streamkit.testing import create_topic, produce_json, read_topic, unique_topic_name

BASE_MS = 1_700_000_000_000


def write_history(broker: str, topic: str) -> None:
    """Writer ``up/0`` sends ``a`` +1 (attempt 1) to partition 0 and commits it (markers in
    both partitions), then ``a`` +5 (attempt 2, not committed yet); a plain producer
    sends ``b`` +10 to partition 1, later in time."""
    first, second = Attempt("up/0", 1 << 24 | 1, 1), Attempt("up/0", 1 << 24 | 1, 2)
    produce_json(broker, topic, [("a", {"n": 1}, 0, BASE_MS)], headers=[first.header()])  # partition 0 @0
    for partition in (0, 1):  # partition 0 @1, partition 1 @0
        produce_json(broker, topic, [(None, b"", partition, BASE_MS + 1)], headers=[commit_header(first)])
    produce_json(broker, topic, [("b", {"n": 10}, 1, BASE_MS + 2000)])  # partition 1 @1
    produce_json(broker, topic, [("a", {"n": 5}, 0, BASE_MS + 3000)], headers=[second.header()])  # partition 0 @2


async def rebuild_to(broker: str, app: streamkit.App, targets: dict[TopicPartition, int], path: Path) -> ProcessorState:
    writers, seal = Writers(app.name), OriginSeal.ephemeral()
    output = Output(app.name, app.dead_letter_topic, app.topics, CaptureProducer(), seal, writers=writers)
    dispatcher = Dispatcher("history", app.tables, output, failure_alarm_after=1000)
    proc = await ProcessorState.open(0, path, app.tables, 5.0)
    io = await KafkaIO(broker).start()
    registry = await LayoutRegistry(broker, io=io).start()
    try:
        await registry.load_origin_seal()
        plan = RebuildPlan(0, KeyFilter(bucket_modulus(0, 1, 1), frozenset({0})))
        plan.targets, plan.owned, plan.keyless = dict(targets), set(targets), set(targets)
        reader = HistoryReader(io, registry, app.handlers, dispatcher, app.group_id)
        task = reader.task(proc)
        assert task.proc.commit_gate is not None  # processing="exactly_once"
        async with asyncio.timeout(60):
            await rebuild(reader, task, plan, Pace(lambda: ({}, 0), 1 << 62, {PROCESSOR_COUNT: 1}))
    finally:
        await io.close()
    return proc


def adding_app(topic: str) -> streamkit.App:
    app = streamkit.App(unique_topic_name("eos-rebuild"), processing="exactly_once")
    totals = app.table("totals", default=int)

    @app.processor(app.topic(topic))
    def add(key: str, value: Any, ctx: streamkit.Context) -> None:
        totals[key] += value["n"]

    return app


def test_a_rebuild_applies_a_record_whose_commit_marker_lies_past_its_target(broker: str, tmp_path: Path) -> None:
    topic = create_topic(broker, unique_topic_name("eos-rebuild"), 2)
    write_history(broker, topic)
    app = adding_app(topic)

    # the group's position: partition 0 just past a's first record (its marker is at 1),
    # partition 1 past b
    targets = {TopicPartition(topic, 0): 1, TopicPartition(topic, 1): 2}
    proc = asyncio.run(rebuild_to(broker, app, targets, tmp_path / "p0"))
    try:
        # a's first record applied, its second (past the target, undecided) not
        assert dict(proc.caches["totals"].items()) == {"a": 1, "b": 10}
        assert proc.loaded.positions == {(topic, 0): 1, (topic, 1): 2}
    finally:
        proc.close()


def test_markers_read_past_the_target_do_not_decide_what_the_processor_reads_on_from_it(
    broker: str, tmp_path: Path
) -> None:
    """Writer up/1 sends x (incarnation I) after up/0's h; up/0's commit marker and then
    up/1's recovery marker (a newer incarnation, naming I's attempt as committed) follow.
    A rebuild to just past h reads both markers to decide h; the processor goes on from
    there: x is committed by the recovery marker, not aborted by what the rebuild saw of
    up/1's newer incarnation."""
    topic = create_topic(broker, unique_topic_name("eos-rebuild"), 1)
    h, x = Attempt("up/0", 1 << 24 | 1, 1), Attempt("up/1", 1 << 24 | 2, 1)
    produce_json(broker, topic, [("h", {"n": 1}, 0, BASE_MS)], headers=[h.header()])  # @0
    produce_json(broker, topic, [("x", {"n": 7}, 0, BASE_MS + 1)], headers=[x.header()])  # @1
    produce_json(broker, topic, [(None, b"", 0, BASE_MS + 2)], headers=[commit_header(h)])  # @2
    recovery = recover_header("up/1", 2 << 24 | 1, [(x.incarnation, 1)])
    produce_json(broker, topic, [(None, b"", 0, BASE_MS + 3)], headers=[recovery])  # @3
    app = adding_app(topic)
    proc = asyncio.run(rebuild_to(broker, app, {TopicPartition(topic, 0): 1}, tmp_path / "p0"))
    try:
        assert dict(proc.caches["totals"].items()) == {"h": 1}
        assert proc.loaded.positions == {(topic, 0): 1}
        gate = proc.commit_gate
        assert gate is not None
        records = [r for r in read_topic(broker, topic) if r.offset >= 1]
        _, delivered, _ = gate.admit((topic, 0), [], records)  # the live route, from the target on
        assert [r.offset for r in delivered] == [1] and gate.dropped == 0
    finally:
        proc.close()
