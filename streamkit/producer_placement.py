"""The producer's placement cache: per topic, how its records are placed and stamped now.

A topic's :class:`streamkit.delivery.TopicPlacement` is made at its first send: with its
layout from the registry (and, asked once per topic, whether it is compacted: its keyed
records then get copies for compaction) or, for a topic without a layout, over its
physical partition count (Kafka's partitioner).  A newer layout replaces it
(:meth:`PlacementCache.switch`); the producer then places its unsent records again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sized

from streamkit.delivery import TopicPlacement
from streamkit.layout.model import TopicLayout
from streamkit.layout.registry import LayoutRegistry

__all__ = ["PlacementCache"]

log = logging.getLogger("streamkit.producer")

Partitions = Callable[[str], Awaitable[Sized]]
"""A topic's physical partitions, as the producer's client has them (for their count)."""


class PlacementCache:
    """The :class:`streamkit.delivery.TopicPlacement` of every topic a producer sent to."""

    def __init__(
        self, producer_id: str, tag: bytes, registry: LayoutRegistry, partitions: Partitions, *, follow_layouts: bool
    ) -> None:
        self.producer_id = producer_id
        self._tag = tag
        self.registry = registry
        self._partitions = partitions
        self.follow_layouts = follow_layouts
        self.topics: dict[str, TopicPlacement] = {}
        """Per topic, its placement now (read directly on the send path: one dict lookup)."""
        self._compacted: dict[str, bool] = {}
        """Per topic with a layout: whether it is compacted (its records get copies)."""

    def layout(self, topic: str) -> TopicLayout | None:
        """The layout ``topic``'s records are placed with (the registry's before its first send)."""
        st = self.topics.get(topic)
        return st.layout if st else self.registry.get(topic)

    def epoch(self, topic: str) -> int:
        st = self.topics.get(topic)
        return st.epoch if st else 0

    async def of(self, topic: str) -> TopicPlacement:
        """``topic``'s placement, made if it has none yet."""
        layout = self.registry.get(topic) if self.follow_layouts else None
        physical = None
        if layout is None:
            parts = await self._partitions(topic)
            physical = len(parts)
        elif topic not in self._compacted:
            try:
                configs = await self.registry.io.topic_configs(topic)
            except Exception as exc:  # noqa: BLE001 - e.g. not allowed to describe it: no copies, said once
                log.warning("%s: %s: its cleanup.policy is unknown (%s): no copies for compaction", self.producer_id,
                            topic, exc)  # fmt: skip
                configs = {}
            self._compacted[topic] = "compact" in configs.get("cleanup.policy", "")
        st = self.topics.get(topic)
        if st is None:  # another task may have made it meanwhile
            st = TopicPlacement(topic, layout, physical, self._tag, compacted=self._compacted.get(topic, False))
            self.topics[topic] = st
        return st

    def switch(self, layout: TopicLayout) -> tuple[TopicPlacement, TopicPlacement | None]:
        """Place ``layout.topic``'s records with ``layout`` from now on: (the new placement, the old)."""
        topic = layout.topic
        old = self.topics.get(topic)
        st = TopicPlacement(topic, layout, None, self._tag, compacted=self._compacted.get(topic, False))
        self.topics[topic] = st
        return st, old
