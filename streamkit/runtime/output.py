"""Everything a worker produces: handler output and dead letters, acknowledged at checkpoints.

Sends are started as records are handled and awaited together at the next checkpoint,
before the checkpoint is written: so a checkpoint never covers input whose output
might still be lost (output is at-least-once; see README "Guarantees").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

from aiokafka import AIOKafkaProducer
from prometheus_client import Counter as PromCounter

from streamkit.app import App
from streamkit.topics import Topic

log = logging.getLogger(__name__)

DEAD_LETTERS = PromCounter(
    "streamkit_dead_letters", "records sent to the dead-letter topic", ["app", "reason"]
)

Header = tuple[str, bytes]


class Output:
    def __init__(self, app: App, producer: AIOKafkaProducer) -> None:
        self.app = app
        self.producer = producer
        self._pending: list[asyncio.Future[Any]] = []
        self.dead_letter_counts: Counter[str] = Counter()
        self.last_error: str | None = None
        self.last_error_at: float | None = None

    def _topic(self, topic: Topic | str) -> Topic:
        if isinstance(topic, Topic):
            return topic
        found = self.app.topics.get(topic)
        return found if found is not None else self.app.topic(topic)

    async def send(self, topic: Topic | str, key: Any, value: Any, headers: list[Header]) -> None:
        t = self._topic(topic)
        fut = await self.producer.send(
            t.name, key=t.encode_key(key), value=t.encode_value(value), headers=headers
        )
        self._pending.append(fut)

    async def dead_letter(self, record: Any, reason: str, exc: BaseException, handler: str = "") -> None:
        """Send the input record as it came (raw bytes) with headers saying why and whence."""
        text = f"{type(exc).__name__}: {exc}"
        headers: list[Header] = [
            ("streamkit.error.reason", reason.encode()),
            ("streamkit.error.exception", text.encode()[:4096]),
            ("streamkit.source.topic", record.topic.encode()),
            ("streamkit.source.partition", str(record.partition).encode()),
            ("streamkit.source.offset", str(record.offset).encode()),
        ]
        if handler:
            headers.append(("streamkit.error.handler", handler.encode()))
        self.dead_letter_counts[reason] += 1
        DEAD_LETTERS.labels(self.app.name, reason).inc()
        self.last_error, self.last_error_at = f"{reason}: {text}", time.time()
        fut = await self.producer.send(
            self.app.dead_letter_topic, key=record.key, value=record.value, headers=headers
        )
        self._pending.append(fut)

    async def flush(self) -> None:
        """Wait until every send started so far is acknowledged (raises the first failure)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        await asyncio.gather(*pending)
