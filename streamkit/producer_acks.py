"""The producer's acknowledgements of layout changes (``streamkit.layout.protocol``).

Every announced change is acknowledged once, also for topics the producer never used
(it may use them next, and the coordinator waits for every live producer): after the
broker acknowledged everything the producer placed before the announcement, and after
``before_ack`` (a worker's consumers first take the announced layout), an ``ack``
control record names where the producer's records of the topic end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from streamkit.layout.control import control_record
from streamkit.layout.model import TopicLayout
from streamkit.lease import SendControl

__all__ = ["ChangeAcks"]

log = logging.getLogger("streamkit.producer")


class ChangeAcks:
    """One producer's acknowledgements of announced layout changes."""

    def __init__(
        self,
        producer_id: str,
        send_control: SendControl,
        inflight: Mapping[str, set[asyncio.Future[Any]]],
        stats: dict[str, int],
        before_ack: Callable[[str, int], Awaitable[Any]] | None = None,
    ) -> None:
        self.producer_id = producer_id
        self._send = send_control
        self._inflight = inflight
        """The producer's batches in flight, per topic (read only)."""
        self._stats = stats
        """The producer's counters: ``acks`` is counted here."""
        self._before_ack = before_ack
        self._acked: set[tuple[str, int, str]] = set()
        self.tasks: set[asyncio.Task[Any]] = set()
        """The acknowledgements under way."""
        self.acked_epoch: dict[str, int] = {}
        """The newest epoch acknowledged per topic."""
        self.ends: dict[str, dict[int, int]] = {}
        """Per topic, partition: the end of the producer's last batch the broker acknowledged."""

    def delivered(self, topic: str, partition: int, end: int) -> None:
        """The broker acknowledged a batch of ``topic[partition]`` that ends at ``end``."""
        ends = self.ends.setdefault(topic, {})
        if end > ends.get(partition, -1):
            ends[partition] = end

    def announce(self, layout: TopicLayout) -> None:
        """Acknowledge ``layout``'s announced change (if any, once), in the background."""
        pend = layout.pending
        if pend is not None:
            key = (layout.topic, pend.epoch, pend.change_id)
            if key not in self._acked:
                self._acked.add(key)
                t = asyncio.create_task(self._ack(layout.topic, pend.epoch, pend.change_id))
                self.tasks.add(t)
                t.add_done_callback(self.tasks.discard)

    async def _ack(self, topic: str, epoch: int, change_id: str) -> None:
        started = time.monotonic()
        pending = list(self._inflight.get(topic, ()))
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self._before_ack is not None:
            await self._before_ack(topic, epoch)
        self.acked_epoch[topic] = max(self.acked_epoch.get(topic, -1), epoch)
        # Where our records end, as the broker acknowledged them: the seal is at least
        # there even if a high watermark read lags an acknowledged produce.
        ends = {str(p): e for p, e in self.ends.get(topic, {}).items()}
        key, value = control_record("ack", self.producer_id, topic=topic, epoch=epoch, change_id=change_id, ends=ends)
        await self._send(key, value)
        self._stats["acks"] += 1
        log.info(
            "%s: acknowledged epoch %d of %s after %.3f s (%d batches were in flight); ends %s",
            self.producer_id,
            epoch,
            topic,
            time.monotonic() - started,
            len(pending),
            ends,
        )
