"""The commit sequence, written down once.

0. The member reads the group's progress log: if a newer generation owns one of its
   partitions, it is a zombie (paused through a rebalance) and its checkpoint is
   rejected: nothing of it is written (`ZombieCheckpointError`).
1. Output and dead letters of every handled record are acknowledged by the broker.
2. Each hosted processor writes its state changes and its input positions, stamped with
   the layout epochs and the group generation, in one atomic store batch (the
   checkpoint). A stamp older than the store's is refused (`ZombieError`). After a crash,
   reopening gives exactly the state of having applied every record before those
   positions once.
3. The positions are recorded in the progress log (generation-fenced: what gating and
   rebuilding hosts read) and committed as the group's Kafka offsets (what tools read).
   A crash between 2 and 3 leaves the group behind the store, never ahead: the store
   wins on restart.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import orjson
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import OffsetAndMetadata
from stores.base import Checkpoint

from streamkit.errors import StreamkitError
from streamkit.layout.epochs import check_stamp

if TYPE_CHECKING:
    from streamkit.runtime.member import GroupMember

log = logging.getLogger(__name__)


class ZombieCheckpointError(StreamkitError):
    """A newer generation of the group owns partitions this member still processes."""


async def checkpoint(member: "GroupMember") -> None:
    if not member.processors:
        return
    t0 = time.monotonic()
    progress = member.worker.progress
    generation = member.assigned_generation
    parts = [(tp.topic, tp.partition) for tp in member.routes]
    await progress.refresh()
    newest = progress.newest_generation(parts)
    if newest > generation:
        raise ZombieCheckpointError(
            f"checkpoint of generation {generation} rejected: generation {newest} owns some of "
            f"{sorted(parts)} (this member was paused through a rebalance)"
        )
    t1 = time.monotonic()
    await member.output.flush()
    t2 = time.monotonic()
    epochs = member.layout_epochs
    for proc in member.processors.values():
        if proc.uncommitted or proc.positions != proc.loaded.positions:
            new = Checkpoint(positions=dict(proc.positions), layout_epochs=dict(epochs), generation=generation)
            check_stamp(proc.loaded, new, what=f"checkpoint of processor {proc.id}")
            proc.commit(new)
    positions: dict[tuple[str, int], int | None] = {}
    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
    meta = orjson.dumps({"gen": generation, "epochs": epochs}).decode()
    for tp, route in member.routes.items():
        pos = route.proc.positions.get((tp.topic, tp.partition))
        if pos is not None and pos > route.committed:
            positions[(tp.topic, tp.partition)] = pos
            offsets[tp] = OffsetAndMetadata(pos, meta)
    t3 = time.monotonic()
    if not offsets:
        return
    await progress.record(member.name, generation, epochs, positions)
    t4 = time.monotonic()
    for tp, om in offsets.items():
        member.routes[tp].committed = om.offset
    try:
        await member.consumer.commit(offsets)
    except (CommitFailedError, IllegalStateError, KafkaError) as exc:
        # The store and the progress log hold the checkpoint; Kafka catches up next time.
        log.warning("member %s: Kafka offset commit failed (%s); checkpoint kept", member.name, exc)
    t5 = time.monotonic()
    if t5 - t0 > 0.5:
        log.warning("slow checkpoint %s: progress %.3f flush %.3f store %.3f record %.3f kafka %.3f", member.name,
                    t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)
