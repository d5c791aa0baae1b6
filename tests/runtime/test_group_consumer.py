"""The member's consumer (``runtime.group_consumer``): a partition stays paused while any
reason holds it, and it is the only user of aiokafka's private group API."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from assignors.group import MemberInfo, StreamkitAssignor
from streamkit.connection import as_connection
from streamkit.runtime.group_consumer import GATE, HELD, GroupConsumer
from streamkit.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
A, B = TopicPartition("t", 0), TopicPartition("t", 1)


class Underlying:
    """What the wrapper drives of aiokafka's consumer (pause and resume only)."""

    def __init__(self) -> None:
        self.paused: set[TopicPartition] = set()
        self.calls: list[tuple[str, tuple[TopicPartition, ...]]] = []

    def pause(self, *tps: TopicPartition) -> None:
        self.calls.append(("pause", tps))
        self.paused.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.calls.append(("resume", tps))
        self.paused.difference_update(tps)


def consumer() -> tuple[GroupConsumer, Underlying]:
    assignor = StreamkitAssignor(MemberInfo(p0=1, p=1, layouts={}))
    gc = GroupConsumer(as_connection("127.0.0.1:1"), Settings(), group_id="g", client_id="c", assignor=assignor)
    fake = Underlying()
    gc._consumer = fake  # type: ignore[assignment]
    return gc, fake


def test_a_partition_is_paused_while_any_reason_holds_it() -> None:
    async def made() -> tuple[GroupConsumer, Underlying]:  # (aiokafka's consumer is made on a loop)
        return consumer()

    gc, fake = asyncio.run(made())
    gate, held = gc.control(GATE), gc.control(HELD)
    gate.pause(A)
    held.pause(A, B)
    assert fake.paused == {A, B} and fake.calls == [("pause", (A,)), ("pause", (B,))]  # A once
    held.resume(A, B)  # the merge lets go: the gate still holds A
    assert fake.paused == {A} and gc.paused() == {A} and gate.paused() == {A} and held.paused() == set()
    gate.resume(A)
    assert fake.paused == set() and gc.holds == {}
    gate.resume(A)  # resuming what is not held does nothing
    assert fake.calls[-1] == ("resume", (A,)) and len(fake.calls) == 4
    held.pause(B)
    gc.forget_pauses()  # the assignment was given up: the client forgot its pauses with it
    assert gc.paused() == set()


def test_only_the_group_consumer_uses_the_private_group_api() -> None:
    users = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "streamkit").rglob("*.py")
        if re.search(r"\._coordinator\b", path.read_text())
    ]
    assert users == ["streamkit/runtime/group_consumer.py"]


def test_the_position_handed_over_is_noted_for_partitions_a_fetch_answer_has_nothing_of(
    broker: str, topic_factory: Callable[..., str], produce: Callable[..., int]
) -> None:
    """``quiet_at`` against the real client: noted for the partitions an answer has none
    of, where the client stands (every offset below handed over); not for those it has
    records of, nor after a seek. (What it is for, a partition ending in a transaction
    marker, needs a broker with transactions: ``test_merging`` checks the rule.)"""
    topic = topic_factory(2)
    produce(topic, [("k", i, 0) for i in range(3)])
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)

    async def run() -> None:
        gc, _ = consumer()
        gc._consumer = AIOKafkaConsumer(bootstrap_servers=broker, auto_offset_reset="earliest")
        await gc._consumer.start()
        try:
            gc._consumer.assign([p0, p1])
            batch: dict[TopicPartition, list[Any]] = {}
            while not batch:
                batch = await gc.getmany(timeout_ms=1000, max_records=None)
            assert [r.offset for r in batch[p0]] == [0, 1, 2] and p1 not in batch
            assert gc.quiet_at(p0) is None and gc.quiet_at(p1) == 0
            assert await gc.getmany(timeout_ms=300, max_records=None) == {}
            assert gc.quiet_at(p0) == 3 == gc.highwater(p0)
            gc.seek(p0, 1)
            assert gc.quiet_at(p0) is None  # the client went back: nothing noted until the next answer
        finally:
            await gc._consumer.stop()

    asyncio.run(run())
