"""The commit sequence, written down once.

1. Output and dead letters of every handled record are acknowledged by the broker.
2. Each hosted processor writes its state changes and its input positions in one atomic
   store batch (the checkpoint). After a crash, reopening gives exactly the state of
   having applied every record before those positions once.
3. The group's Kafka offsets are committed to the same positions. They are what other
   members see of our progress (seed 001's T1) and where a host without our store
   stops rebuilding and starts emitting. A crash between 2 and 3 leaves Kafka behind the
   store, never ahead: the store wins on restart.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import OffsetAndMetadata

if TYPE_CHECKING:
    from streamkit.runtime.member import GroupMember

log = logging.getLogger(__name__)


async def checkpoint(member: "GroupMember") -> None:
    if not member.processors:
        return
    await member.output.flush()
    generation = member.generation
    epochs = member.layout_epochs
    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
    for proc in member.processors.values():
        if proc.uncommitted or proc.positions != proc.loaded.positions:
            proc.commit(generation, epochs)
    for tp, route in member.routes.items():
        pos = route.proc.positions.get((tp.topic, tp.partition))
        if pos is not None and pos > route.committed:
            offsets[tp] = OffsetAndMetadata(pos, "")
    if not offsets:
        return
    try:
        await member.consumer.commit(offsets)
    except (CommitFailedError, IllegalStateError, KafkaError) as exc:
        # The store already holds the checkpoint; Kafka catches up at the next commit.
        log.warning("member %s: offset commit failed (%s); store checkpoint kept", member.name, exc)
        return
    for tp, om in offsets.items():
        member.routes[tp].committed = om.offset
