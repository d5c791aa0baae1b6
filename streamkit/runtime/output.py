"""Everything a worker produces: handler output and dead letters, acknowledged at checkpoints.

Sends go through the streamkit producer (placement by the output topic's layout, epoch
stamps, the layout change protocol) and are awaited together at the next checkpoint,
before the checkpoint is written: so a checkpoint never covers input whose output
might still be lost (output is at-least-once; see README "Guarantees").
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from streamkit.errors import StreamkitError
from streamkit.exactly_once.writer import Writers
from streamkit.layout.seal import OriginSeal
from streamkit.layout.stamps import EPOCH_HEADER, PRODUCER_HEADER, STAMP_HEADER
from streamkit.layout.strays import STRAY_HEADER
from streamkit.sinks.outbox import SinkOutbox
from streamkit.topics import Topic

log = logging.getLogger(__name__)

Header = tuple[str, bytes]
_STAMP_HEADERS = (STAMP_HEADER, EPOCH_HEADER, PRODUCER_HEADER, STRAY_HEADER)


class Sender(Protocol):
    """What output goes through: the worker's ``streamkit.producer.Producer``, or a test
    driver's capture of what was sent."""

    async def send(
        self,
        topic: str,
        key: Any,
        value: Any,
        headers: Sequence[Header] | None = None,
        *,
        timestamp_ms: int | None = None,
    ) -> Any: ...

    async def flush(self) -> None: ...


class Output:
    """Sends handler output (serdes of the declared `topics`; a topic named but not
    declared gets the defaults) and dead letters to `dead_letter_topic`."""

    def __init__(
        self,
        app_name: str,
        dead_letter_topic: str,
        topics: Mapping[str, Topic],
        producer: Sender,
        seal: OriginSeal | None = None,
        writers: Writers | None = None,
    ) -> None:
        self.app_name = app_name
        self.writers = writers
        """The hosted processors' attempt writers (``processing="exactly_once"``): handler
        output is stamped with its processor's attempt. None: at least once."""
        self.sink_outboxes: dict[int, SinkOutbox] = {}
        """The hosted processors' sink rows, by processor id (the app's sinks)."""
        self.seal = seal or OriginSeal.ephemeral()
        """Seals the origin of forwarded strays (the cluster's, for its workers to recognise)."""
        self.dead_letter_topic = dead_letter_topic
        self.producer = producer
        self._topics = topics
        self._undeclared: dict[str, Topic] = {}
        self.dead_letter_counts: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()
        """Records the handlers sent, per output topic."""
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.strays_forwarded: Counter[str] = Counter()
        """Strays forwarded to where the layout places them, per "topic/partition" they lay in."""

    def _topic(self, topic: Topic | str) -> Topic:
        if isinstance(topic, Topic):
            return topic
        found = self._topics.get(topic) or self._undeclared.get(topic)
        if found is None:
            found = self._undeclared[topic] = Topic.declare(topic, "str", "json")
        return found

    async def send(self, topic: Topic | str, key: Any, value: Any, headers: list[Header], processor: int = -1) -> None:
        t = self._topic(topic)
        self.sent[t.name] += 1
        if self.writers is not None and (writer := self.writers.by_processor.get(processor)) is not None:
            if t.name not in self._topics:
                raise StreamkitError(
                    f"processing='exactly_once': processor {processor} sends to topic {t.name!r}, which the app does "
                    f"not declare; declare it (app.topic({t.name!r}, ...)) so that a restart can abort what was "
                    "sent there before a crash"
                )
            headers = [*headers, writer.header(t.name)]
        await self.producer.send(t.name, t.encode_key(key), t.encode_value(value), headers)

    def write_rows(self, rows: list[tuple[int, str, dict[str, Any]]]) -> None:
        """Sink rows (processor, sink, row) into their processor's outbox."""
        for pid, sink, row in rows:
            outbox = self.sink_outboxes.get(pid)
            if outbox is None:
                raise StreamkitError(f"processor {pid} wrote to sink {sink!r}, but the app declares no sink")
            outbox.add(sink, row)

    def declared(self) -> list[str]:
        """The output topics the app declares (where a recovery marker goes)."""
        return sorted(self._topics)

    async def dead_letter(self, record: Any, reason: str, exc: BaseException | str, handler: str = "") -> None:
        """Send the input record as it came (raw bytes) with headers saying why and whence."""
        text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
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
        self.last_error, self.last_error_at = f"{reason}: {text}", time.time()
        await self.producer.send(self.dead_letter_topic, record.key, record.value, headers)

    async def stray(self, record: Any, policy: str) -> None:
        """A record a plain producer put where the topic's layout does not place its key
        (``streamkit.layout.strays``): forward it through the layout-aware producer (its
        key, value, timestamp and own headers, and where it came from), or dead-letter it."""
        if policy == "dead-letter":
            await self.dead_letter(
                record, "misplaced",
                f"{record.topic}[{record.partition}] offset {record.offset}: the topic's layout does not place "
                f"this record here (written by a producer that does not follow the layout)",
            )  # fmt: skip
            return
        headers = [h for h in record.headers or () if h[0] not in _STAMP_HEADERS]
        origin = self.seal.seal(record.topic, record.partition, record.offset, record.key, record.value)
        headers.append((STRAY_HEADER, origin))
        self.strays_forwarded[f"{record.topic}/{record.partition}"] += 1
        await self.producer.send(record.topic, record.key, record.value, headers, timestamp_ms=record.timestamp)

    async def flush(self) -> None:
        """Wait until every send started so far is acknowledged (raises the first failure)."""
        await self.producer.flush()
