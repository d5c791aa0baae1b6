"""Key-level concurrency: one partition's records through an async handler, up to N at
once, one at a time per key.

Like Confluent Parallel Consumer's key ordering: records of different keys overlap
(an I/O-bound handler that awaits 5 ms per record goes up to N times faster), records
of one key run one after the other in offset order, so per-key state and output keep
their order. Records finish out of offset order: the offsets handed over and not
finished are ``pending`` (what a checkpoint turns into IC ranges, `icranges.snapshot`).

The scheduler runs only inside `run`, which returns with no handler running: a
checkpoint, a rebalance or another processor's records (tables are bound to one
processor at a time) never meet a handler in flight. Records still queued when `run`
returns stay queued for the next call.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Any


class KeyScheduler:
    """The queued and pending records of one partition's route."""

    def __init__(self, limit: int, max_pending: int) -> None:
        self.limit = limit
        self.max_pending = max_pending
        """Beyond this many pending offsets `run` goes on until it is back under (back-pressure)."""
        self._queues: dict[Hashable, deque[Any]] = {}
        self._ready: deque[Hashable] = deque()  # keys with queued records and none running
        self.pending: set[int] = set()
        self.most_running = 0

    @property
    def queued(self) -> bool:
        return bool(self._ready)

    def submit(self, records: list[Any]) -> None:
        """Queue records (ascending offsets) behind their keys' earlier ones."""
        for rec in records:
            queue = self._queues.get(rec.key)
            if queue is None:
                queue = self._queues[rec.key] = deque()
                self._ready.append(rec.key)
            queue.append(rec)
            self.pending.add(rec.offset)

    async def run(self, handle: Callable[[Any], Awaitable[None]], budget: float) -> None:
        """Hand queued records to ``handle`` until none is left, or ``budget`` seconds have
        passed and at most ``max_pending`` are pending; return once none is running."""
        deadline = time.monotonic() + budget
        running: dict[asyncio.Task[None], tuple[Hashable, int]] = {}
        try:
            await self._run(handle, deadline, running)
        finally:  # cancelled, or a bug: no handler may go on running against closed stores
            for task in running:
                task.cancel()
            if running:
                await asyncio.wait(running)

    async def _run(
        self, handle: Callable[[Any], Awaitable[None]], deadline: float, running: dict[asyncio.Task[None], Any]
    ) -> None:
        while True:
            while (
                self._ready
                and len(running) < self.limit
                and (time.monotonic() < deadline or len(self.pending) > self.max_pending)
            ):
                key = self._ready.popleft()
                rec = self._queues[key].popleft()
                running[asyncio.ensure_future(handle(rec))] = (key, rec.offset)
            self.most_running = max(self.most_running, len(running))
            if not running:
                return
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in [t for t in running if t in done]:  # in the order they started, not the set's
                key, offset = running.pop(task)
                task.result()  # ``handle`` reports failures itself; anything else is a bug
                self.pending.discard(offset)
                if self._queues[key]:
                    self._ready.append(key)
                else:
                    del self._queues[key]
