"""A partition's Kafka offset catches up while idle: a shared one when a sharer's commit
from an older view of the progress log lands last, any one when its commit failed in a
rebalance (real broker, real stores, the real commit sequence)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import CommitFailedError
from aiokafka.structs import OffsetAndMetadata

from stores.rocksdb import RocksDBStore
from streamkit.joins.merge import TimeMerge
from streamkit.kafkaio import KafkaIO
from streamkit.runtime import checkpointing
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.progress import ProgressLog
from streamkit.runtime.task import Task

TP = TopicPartition("in", 0)
SHARERS = (0, 1)


class Sharer:
    """One member hosting one processor that shares partition ``in``/0 with the other."""

    def __init__(
        self,
        name: str,
        pid: int,
        path: Path,
        log: ProgressLog,
        kafka: dict[TopicPartition, int],
        sharers: tuple[int, ...] = SHARERS,
    ) -> None:
        self.name = name
        self.sharers = sharers
        self.fail = False  # the group rebalanced: a commit fails (the checkpoint is kept)
        self.proc = ProcessorState(pid, RocksDBStore.open(str(path), []), {})
        self.task = Task(self.proc, None, TimeMerge(0))  # type: ignore[arg-type]  # (only its checkpoint is taken)
        self.log = log
        self.kafka = kafka  # the group's committed offsets: the last commit to land wins
        self.sent: dict[TopicPartition, int] = {}
        self.committed = -1  # this processor's position as last checkpointed
        self.hold: asyncio.Event | None = None

    async def _commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        if self.hold is not None:
            await self.hold.wait()
        if self.fail:
            raise CommitFailedError("the group has already rebalanced")
        self.kafka.update((tp, o.offset) for tp, o in offsets.items())
        self.sent.update((tp, o.offset) for tp, o in offsets.items())

    async def checkpoint(self, position: int | None = None) -> None:
        if position is not None:
            self.proc.positions[("in", 0)] = position
            self.proc.uncommitted += 1
        slot = checkpointing.Slot(TP, self.proc, self.committed, self.sharers, kafka_offset=self.sent.get(TP, -1))
        committed = await checkpointing.checkpoint(
            checkpointing.CheckpointStamp(self.name, 1, {}),
            [self.task],
            [slot],
            checkpointing.CheckpointSinks(self.log, _nothing, self._commit),
        )
        self.committed = committed.get((TP, self.proc.id), self.committed)


async def _nothing() -> None:
    return None


@contextlib.asynccontextmanager
async def progress_logs(broker: str, prefix: str) -> AsyncIterator[Callable[[], ProgressLog]]:
    """Makes progress logs of one new group (one broker client, one producer for all)."""
    group = f"{prefix}-{uuid.uuid4().hex[:8]}"
    async with KafkaIO(broker) as io:
        producer = AIOKafkaProducer(bootstrap_servers=broker)
        await producer.start()
        try:
            yield lambda: ProgressLog(io, producer, group)
        finally:
            await producer.stop()


def test_a_sharers_commit_from_an_older_view_landing_last_is_made_good_while_idle(broker: str, tmp_path: Path) -> None:
    async def go() -> tuple[int, int]:
        kafka: dict[TopicPartition, int] = {}
        async with progress_logs(broker, "shared") as progress_log:
            a = Sharer("a", 0, tmp_path / "a", progress_log(), kafka)
            b = Sharer("b", 1, tmp_path / "b", progress_log(), kafka)
            try:
                await a.log.start()
                await b.log.start()
                await a.checkpoint(50)
                await b.checkpoint(40)  # both reported: the group is at 40
                assert kafka[TP] == 40
                a.hold = asyncio.Event()
                late = asyncio.create_task(a.checkpoint(60))  # a sees the group at 40 (b's 40)
                async with asyncio.timeout(30):
                    while a.log.position("in", 0, 0) != 60:  # a's record is in the log; its commit is held
                        if late.done():
                            late.result()
                            raise AssertionError("a's checkpoint ended with its commit held")
                        await a.log.refresh()
                        await asyncio.sleep(0.01)
                await b.checkpoint(70)  # b sees a's 60: the group is at 60
                assert kafka[TP] == 60
                a.hold.set()
                await late  # a's 40 lands last
                stale = kafka[TP]
                await a.checkpoint()  # idle: nothing new of its own
                await b.checkpoint()
                return stale, kafka[TP]
            finally:
                a.proc.store.close()
                b.proc.store.close()

    stale, final = asyncio.run(go())
    assert stale == 40  # the race happened as staged
    assert final == 60


def test_a_partitions_commit_failed_in_a_rebalance_is_made_good_while_idle(broker: str, tmp_path: Path) -> None:
    """A drained partition's last records, checkpointed while the group rebalanced: its
    Kafka offset must not wait for a next record that never comes."""

    async def go() -> tuple[int | None, int | None]:
        kafka: dict[TopicPartition, int] = {}
        async with progress_logs(broker, "whole") as progress_log:
            a = Sharer("a", 0, tmp_path / "a", progress_log(), kafka, sharers=())
            try:
                await a.log.start()
                a.fail = True
                await a.checkpoint(522)  # in the store and the progress log; Kafka's commit failed
                assert a.committed == 522 and a.log.position("in", 0) == 522
                failed = kafka.get(TP)
                a.fail = False
                await a.checkpoint()  # idle: nothing new
                return failed, kafka.get(TP)
            finally:
                a.proc.store.close()

    assert asyncio.run(go()) == (None, 522)
