"""The member's consumer (``runtime.group_consumer``): a partition stays paused while any
reason holds it, and it is the only user of aiokafka's private group API."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from aiokafka import TopicPartition

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
