"""The topic admin of :class:`streamkit.kafkaio.KafkaIO`: creating topics and partitions,
partition counts, topic configs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

from aiokafka.admin import NewPartitions, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code

from streamkit.errors import TopicNotFoundError
from streamkit.kafkaio.base import KafkaIOBase, KafkaIOError

__all__ = ["CREATE_CONFIGS", "CREATE_PARTITIONS_API", "KafkaAdmin"]

CREATE_PARTITIONS_API = 37
"""The CreatePartitions API key (``KafkaIO.supports_api``: can the broker add partitions?)."""

CREATE_CONFIGS: dict[str, str] = {"retention.ms": "604800000", "retention.bytes": "-1"}
"""Set at creation so that DescribeConfigs reports them: the reference broker's
DescribeConfigs returns only configs given at creation, and peers (quixstreams:
KeyError 'retention.ms') need these."""


class KafkaAdmin(KafkaIOBase):
    """Topic admin (:class:`streamkit.kafkaio.KafkaIO` is one)."""

    async def create_topic(
        self,
        topic: str,
        partitions: int,
        *,
        replication_factor: int = 1,
        configs: Mapping[str, str] = CREATE_CONFIGS,
        timeout: float = 10.0,
        exist_ok: bool = True,
    ) -> bool:
        """Create ``topic`` with ``configs`` set at creation; wait until the broker shows it.

        Returns False if it existed already (``TopicAlreadyExistsError`` without
        ``exist_ok``); any other error of the answer is raised (aiokafka returns
        per-topic errors instead of raising them).  A topic this call created is waited
        for until its metadata shows all ``partitions``.
        """
        admin = await self.admin()
        created = True
        try:
            response = await admin.create_topics(
                [NewTopic(topic, partitions, replication_factor, topic_configs=dict(configs))],
                timeout_ms=int(timeout * 1000),
            )
        except TopicAlreadyExistsError:
            created = False
        else:
            for topic_error in response.topic_errors:
                code, message = topic_error[1], topic_error[2] if len(topic_error) > 2 else None
                if code == TopicAlreadyExistsError.errno:
                    created = False
                elif code:
                    error = for_code(code)
                    raise error(f"create topic {topic!r}: {message or error.__name__}")
        if not created and not exist_ok:
            raise TopicAlreadyExistsError(f"topic {topic!r} already exists")
        deadline = time.monotonic() + timeout
        while True:
            count = await self.partition_count(topic)
            if count is not None and (not created or count >= partitions):
                return created
            if time.monotonic() > deadline:
                raise KafkaIOError(f"topic {topic} did not appear with {partitions} partitions within {timeout} s")
            await asyncio.sleep(0.02)

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        """Physical partition count per topic; ``TopicNotFoundError`` names a missing one."""
        counts: dict[str, int] = {}
        for name in topics:
            n = await self.partition_count(name)
            if n is None:
                raise TopicNotFoundError(
                    f"topic {name!r} does not exist (create it: streamkit topics create {name} --partitions N)"
                )
            counts[name] = n
        return counts

    async def topic_configs(self, topic: str) -> dict[str, str]:
        """``topic``'s configs as the broker describes them (the reference broker: only
        those set at creation)."""
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        admin = await self.admin()
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        # each resource: (error code, error message, type, name, [(name, value, ...), ...])
        for r in responses:
            for res in r.resources:
                if res[0]:
                    raise KafkaIOError(f"DescribeConfigs of {topic} failed: error {res[0]} {res[1] or ''}".strip())
        return {e[0]: e[1] for r in responses for res in r.resources for e in res[4] if e[1] is not None}

    async def create_partitions(self, topic: str, total: int, timeout: float = 30.0) -> None:
        admin = await self.admin()
        await admin.create_partitions({topic: NewPartitions(total_count=total)}, timeout_ms=int(timeout * 1000))
        deadline = time.monotonic() + timeout
        while ((await self.partition_count(topic)) or 0) < total:
            if time.monotonic() > deadline:
                raise KafkaIOError(f"{topic} did not reach {total} partitions within {timeout} s")
            await asyncio.sleep(0.1)
