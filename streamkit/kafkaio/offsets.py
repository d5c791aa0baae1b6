"""The offsets :class:`streamkit.kafkaio.KafkaIO` reads: high watermarks (from fetch
answers), log start offsets, a group's committed offsets.

High watermarks come from *fetch* responses: the reference broker answers ListOffsets
wrongly when the last batch holds several records.  A fetch far beyond the log end
returns the high watermark without data there; on brokers that answer it with
OFFSET_OUT_OF_RANGE (Apache Kafka), ListOffsets is right and is used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from aiokafka.errors import for_code
from aiokafka.protocol.offset import OffsetRequest
from aiokafka.structs import TopicPartition

from streamkit.kafkaio.base import KafkaIOBase, KafkaIOError

__all__ = ["KafkaOffsets"]

_BEYOND = 1 << 62


class KafkaOffsets(KafkaIOBase):
    """Offsets of partitions and of groups (:class:`streamkit.kafkaio.KafkaIO` is one)."""

    async def high_watermark(self, topic: str, partition: int) -> int:
        """The partition's high watermark, from a fetch response.

        A fetch far beyond the end answers it without data on Tansu.  Brokers that
        answer such a fetch with OFFSET_OUT_OF_RANGE (Apache Kafka) implement
        ListOffsets correctly, which is then used.
        """
        for _ in range(5):  # an answer without the partition (hw -1) is asked again
            err, hw, _ = await self._fetch_raw(topic, partition, _BEYOND, max_wait_ms=1, max_bytes=64)
            if err == 0 and hw >= 0:
                return hw
            if err:
                break
        tp = TopicPartition(topic, partition)
        node = await self._leader(tp)
        resp = await self.client.send(node, OffsetRequest(-1, 0, [(topic, [(partition, -1)])]))
        for _t, parts in resp.topics:
            for part in parts:
                if part[0] == partition and part[1] == 0:
                    return int(part[-1] if len(part) <= 4 else part[3])
        raise KafkaIOError(f"cannot read the high watermark of {topic}[{partition}]: {for_code(err).__name__}")

    async def log_start_offsets(self, topic: str, partitions: Iterable[int]) -> dict[int, int]:
        """Each partition's log start offset (ListOffsets, earliest): records below it are
        gone (retention, deleted records)."""
        out: dict[int, int] = {}
        for partition in sorted(set(partitions)):
            node = await self._leader(TopicPartition(topic, partition))
            resp = await self.client.send(node, OffsetRequest(-1, 0, [(topic, [(partition, -2)])]))
            for _t, parts in resp.topics:
                for part in parts:
                    if part[0] == partition:
                        if part[1] != 0:
                            raise KafkaIOError(
                                f"cannot read the log start offset of {topic}[{partition}]: "
                                f"{for_code(part[1]).__name__}"
                            )
                        out[partition] = int(part[-1] if len(part) <= 4 else part[3])
        return out

    async def high_watermarks(self, topic: str, partitions: Iterable[int]) -> dict[int, int]:
        parts = sorted(set(partitions))
        hws = await asyncio.gather(*(self.high_watermark(topic, p) for p in parts))
        return dict(zip(parts, hws))

    async def topic_ends(self, topic: str) -> dict[int, int]:
        """The high watermark of every partition of ``topic`` (none if it does not exist)."""
        count = await self.partition_count(topic, refresh=False)
        return await self.high_watermarks(topic, range(count or 0))

    async def committed(self, group: str, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        """The group's committed offsets (partitions without a commit are left out)."""
        admin = await self.admin()
        res = await admin.list_consumer_group_offsets(group, partitions=[TopicPartition(topic, p) for p in partitions])
        return {tp.partition: om.offset for tp, om in res.items() if om is not None and om.offset >= 0}
