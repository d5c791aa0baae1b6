"""The one Kafka consumer of a group member, and the only user of aiokafka's private API.

It owns the member's pauses: a partition is paused while any reason holds it, a gate
(``admission``) or back-pressure from the time-ordered merge (``merging.HeldBack``), so
that one lifting its pause never resumes a partition the other still holds. Each of them
drives the consumer through :meth:`GroupConsumer.control`, a view that pauses for its
reason only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from assignors.group import StreamkitAssignor
from streamkit.connection import Connection
from streamkit.kafkaio import fetch as lean_fetch
from streamkit.settings import Settings

__all__ = ["GATE", "HELD", "GroupConsumer", "PauseControl"]

GATE = "gate"
"""A partition's gate holds it (``admission``)."""
HELD = "held"
"""The time-ordered merge holds too many of its topic's records (``merging.HeldBack``)."""


class PauseControl:
    """The consumer as one reason for pausing sees it: ``pause``/``resume``/``seek``
    (``admission.ConsumerControl``)."""

    def __init__(self, owner: GroupConsumer, reason: str) -> None:
        self._owner = owner
        self.reason = reason

    def pause(self, *partitions: TopicPartition) -> None:
        self._owner.hold(self.reason, partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._owner.release(self.reason, partitions)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._owner.seek(partition, offset)

    def paused(self) -> set[TopicPartition]:
        """The partitions this reason holds."""
        return {tp for tp, why in self._owner.holds.items() if self.reason in why}


class GroupConsumer:
    """A member's consumer: the group protocol (generation, rejoin), fetches, seeks,
    commits, and pauses by reason."""

    def __init__(
        self, connection: Connection, settings: Settings, *, group_id: str, client_id: str, assignor: StreamkitAssignor
    ) -> None:
        lean_fetch.install()
        s = settings
        self._consumer = AIOKafkaConsumer(
            **connection.client_kwargs(),
            group_id=group_id,
            client_id=client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            partition_assignment_strategy=(assignor,),
            session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            max_poll_interval_ms=s.max_poll_interval_ms,
            fetch_max_bytes=s.fetch_max_bytes,
            fetch_max_wait_ms=s.fetch_max_wait_ms,
            max_partition_fetch_bytes=s.max_partition_fetch_bytes,
        )
        self.holds: dict[TopicPartition, set[str]] = {}
        """Per paused partition: the reasons that hold it."""
        self._quiet_at: dict[TopicPartition, int] = {}
        """Per assigned partition the last fetch answer brought nothing of: the position
        the client had handed over to then (``quiet_at``)."""

    # -- the group ---------------------------------------------------------------------------
    async def start(self, topics: Iterable[str], listener: ConsumerRebalanceListener) -> None:
        await self._consumer.start()
        self._consumer.subscribe(list(topics), listener=listener)

    async def stop(self) -> None:
        await self._consumer.stop()

    @property
    def generation(self) -> int:
        """The group generation the coordinator is in (-1: none, e.g. after losing the group)."""
        coordinator = self._consumer._coordinator
        return coordinator.generation if coordinator is not None else -1

    def request_rejoin(self) -> None:
        """Ask for a rebalance (at the next poll)."""
        self._consumer._coordinator.request_rejoin()

    # -- records -----------------------------------------------------------------------------
    async def getmany(self, *, timeout_ms: int, max_records: int | None) -> dict[TopicPartition, list[Any]]:
        batch = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        self._note_quiet(batch)
        return batch

    def _note_quiet(self, batch: dict[TopicPartition, list[Any]]) -> None:
        subscription = self._consumer._subscription.subscription
        assignment = subscription.assignment if subscription is not None else None
        self._quiet_at.clear()
        if assignment is None:
            return
        for tp in assignment.tps:
            if tp not in batch and (state := assignment.state_value(tp)).has_valid_position:
                self._quiet_at[tp] = state.position

    def quiet_at(self, partition: TopicPartition) -> int | None:
        """Where the client stood in ``partition`` when the last fetch answer brought
        none of its records: every offset below was handed over (None: the answer had
        records of it, or the client has no position). It passes offsets that hold no
        record, which a consumer's positions never reach: a transaction's commit
        marker, the last offset of a partition a transactional producer wrote."""
        return self._quiet_at.get(partition)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._quiet_at.pop(partition, None)
        self._consumer.seek(partition, offset)

    async def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        await self._consumer.commit(offsets)

    def assignment(self) -> set[TopicPartition]:
        return set(self._consumer.assignment())

    def highwater(self, partition: TopicPartition) -> int | None:
        """The high watermark the last fetch of ``partition`` reported (None: none yet);
        AssertionError if the partition is not assigned (as aiokafka)."""
        return self._consumer.highwater(partition)

    # -- pauses ------------------------------------------------------------------------------
    def control(self, reason: str) -> PauseControl:
        return PauseControl(self, reason)

    def hold(self, reason: str, partitions: Iterable[TopicPartition]) -> None:
        fresh = []
        for tp in partitions:
            why = self.holds.setdefault(tp, set())
            if not why:
                fresh.append(tp)
            why.add(reason)
        if fresh:
            self._consumer.pause(*fresh)

    def release(self, reason: str, partitions: Iterable[TopicPartition]) -> None:
        free = []
        for tp in partitions:
            why = self.holds.get(tp)
            if why is None:
                continue
            why.discard(reason)
            if not why:
                del self.holds[tp]
                free.append(tp)
        if free:
            self._consumer.resume(*free)

    def paused(self) -> set[TopicPartition]:
        return set(self.holds)

    def gated(self) -> set[TopicPartition]:
        """The partitions a gate holds (whatever else holds them too)."""
        return {tp for tp, why in self.holds.items() if GATE in why}

    def forget_pauses(self) -> None:
        """After the assignment is given up: the client forgets its pauses with it."""
        self.holds.clear()
