"""Fencing of a producer that missed a layout change, as the producer sees it.

A coordinator names the producers that did not acknowledge a change in time in the
sealed layout (``Seal.fenced``). A producer that reads its own name there was paused
or partitioned: records it had already sent may be late. It logs a warning, keeps a
`FenceEvent`, writes a ``fenced`` control record (for operators), calls ``on_fence``
if it is a callable, and with ``on_fence="raise"`` refuses every later send
(`ProducerFencedError`) until cleared.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from streamkit.errors import StreamkitError
from streamkit.layout.control import control_record
from streamkit.layout.model import TopicLayout

__all__ = ["FenceEvent", "FenceWatch", "ProducerFencedError"]

log = logging.getLogger("streamkit.producer")


class ProducerFencedError(StreamkitError):
    """This producer missed a layout change (it did not acknowledge in time)."""


@dataclass(frozen=True)
class FenceEvent:
    topic: str
    epoch: int
    change_id: str
    detected_at: float
    """``time.time()`` when this producer learnt it."""


class FenceWatch:
    """The fence events of one producer and what it does about them."""

    def __init__(
        self,
        producer_id: str,
        on_fence: str | Callable[[FenceEvent], Any],
        report: Callable[[bytes, bytes], Awaitable[Any]],
    ) -> None:
        self.producer_id = producer_id
        self.on_fence = on_fence
        self._report = report
        self._seen: set[tuple[str, int]] = set()
        self.events: list[FenceEvent] = []
        self.pending: FenceEvent | None = None
        """With ``on_fence="raise"``: the fence that makes sends raise until cleared."""

    def raise_if_fenced(self) -> None:
        ev = self.pending
        if ev is not None:
            raise ProducerFencedError(
                f"producer {self.producer_id} was fenced at epoch {ev.epoch} of {ev.topic}: it missed a layout "
                "change and records it sent before may be late; call clear_fence() to go on"
            )

    def check(self, layout: TopicLayout) -> None:
        """Act on every sealed change of ``layout`` that names this producer as fenced."""
        for s in layout.seals:
            if self.producer_id in s.fenced and (layout.topic, s.epoch) not in self._seen:
                self._seen.add((layout.topic, s.epoch))
                ev = FenceEvent(layout.topic, s.epoch, s.change_id, time.time())
                self.events.append(ev)
                log.warning(
                    "producer %s was fenced by the %s of %s to epoch %d: it did not acknowledge in time "
                    "(paused or partitioned?); records it had already sent may be late",
                    self.producer_id,
                    s.kind.value,
                    layout.topic,
                    s.epoch,
                )
                key, value = control_record("fenced", self.producer_id, topic=layout.topic, epoch=s.epoch)
                t = asyncio.ensure_future(self._report(key, value))
                t.add_done_callback(_ignore)
                if callable(self.on_fence):
                    try:
                        self.on_fence(ev)
                    except Exception:  # noqa: BLE001
                        log.exception("on_fence callback failed")
                elif self.on_fence == "raise":
                    self.pending = ev


def _ignore(f: asyncio.Future[Any]) -> None:
    if not f.cancelled():
        f.exception()
