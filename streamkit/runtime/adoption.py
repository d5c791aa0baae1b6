"""Which layout epoch each group member's routes are gated with, and a wait for one.

A plain producer's record is judged by the stray rule of the layout its reader knows.
A reader that learnt of an expansion's seal only after reading past it would judge the
records beyond the seal by the rule before it: a key the expansion moved out of a split
parent is applied in place there instead of being forwarded. So a worker's producer
acknowledges an announced change (which the seal waits for) only once every member's
routes have taken the announced layout: they hold the partitions whose keys the change
alters (``strays.altered_by``) at their positions, which lie below the seal, until the
sealed layout arrives.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from streamkit.layout.model import TopicLayout

log = logging.getLogger(__name__)

ADOPTION_WAIT = 3.0
"""Seconds a worker's producer waits for its members before acknowledging anyway: below
the coordinator's default wait for acknowledgements (5 s), so a member held up (a long
rebalance) delays the seal but never gets the producer fenced."""

HOLD_LIMIT_MS = 15_000
"""How long after an announcement routes hold the partitions it alters at most: a
coordinator that died before sealing (``topics resume`` finishes its change) does not
stop them for longer."""


def holding(layout: TopicLayout, now_ms: int | None = None) -> bool:
    """Whether the routes of ``layout``'s topic hold what its announced change alters."""
    pend = layout.pending
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return pend is not None and now - pend.ts_ms < HOLD_LIMIT_MS


class LayoutAdoptions:
    """Per member and topic, the newest layout epoch its routes were gated with."""

    def __init__(self) -> None:
        self._epochs: dict[tuple[str, str], int] = {}
        self._members: dict[str, frozenset[str]] = {}
        self._changed = asyncio.Event()

    def register(self, member: str, topics: Iterable[str]) -> None:
        """``member`` reads ``topics`` from now on (until :meth:`unregister`)."""
        self._members[member] = frozenset(topics)

    def unregister(self, member: str) -> None:
        self._members.pop(member, None)
        self._wake()

    def adopted(self, member: str, topic: str, epoch: int) -> None:
        key = (member, topic)
        if epoch > self._epochs.get(key, -1):
            self._epochs[key] = epoch
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def behind(self, topic: str, epoch: int) -> list[str]:
        """The members whose routes are gated with an epoch of ``topic`` before ``epoch``."""
        return sorted(
            m for m, topics in self._members.items() if topic in topics and self._epochs.get((m, topic), -1) < epoch
        )

    async def wait(self, topic: str, epoch: int, timeout: float) -> bool:
        """Until every member has taken ``epoch`` of ``topic`` (True), or ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while behind := self.behind(topic, epoch):
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning(
                    "%s: epoch %d announced; members %s have not taken it after %.1f s: acknowledging anyway",
                    topic, epoch, behind, timeout,
                )  # fmt: skip
                return False
            try:
                async with asyncio.timeout(left):
                    await self._changed.wait()
            except TimeoutError:
                pass
        return True
