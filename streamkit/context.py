"""The context a handler receives with each record.

One context object per group member is reused for every record (the runtime swaps the
record it points at), so building it costs nothing per record. Do not keep a reference
to it past the handler call; copy the fields you need.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Header = tuple[str, bytes]


class Outbox:
    """Records a handler asked to send; the runtime produces them after the handler returns.

    Sync handlers cannot await a produce; collecting here keeps them sync and lets the
    runtime batch the sends. In rebuild (catch-up) mode the outbox drops what it gets.
    """

    __slots__ = ("items", "rows", "suppress")

    def __init__(self) -> None:
        self.items: list[tuple[Any, Any, Any, list[Header], int]] = []
        """(topic, key, value, headers, the processor that sent it)."""
        self.rows: list[tuple[int, str, dict[str, Any]]] = []
        """Sink rows: (processor, sink, row)."""
        self.suppress = False

    def write(self, processor: int, sink: str, row: dict[str, Any]) -> None:
        if not self.suppress:
            self.rows.append((processor, sink, row))

    def add(self, topic: Any, key: Any, value: Any, headers: list[Header], processor: int = -1) -> None:
        if not self.suppress:
            self.items.append((topic, key, value, headers, processor))


class Context:
    """What a handler knows about the record it handles, and how it sends output."""

    __slots__ = ("_rec", "_outbox", "processor", "stream_time")

    def __init__(self, outbox: Outbox) -> None:
        self._rec: Any = None
        self._outbox = outbox
        self.processor: int = -1
        self.stream_time: int = -1
        """The processor's stream time (ms) with this record; -1: not tracked (windows do
        not close)."""

    @property
    def replaying(self) -> bool:
        """Whether the record is handled again (a rebuild of a processor's state, a replay):
        its output and what it missed were sent and said when it was first handled."""
        return self._outbox.suppress

    @property
    def topic(self) -> str:
        return self._rec.topic

    @property
    def partition(self) -> int:
        return self._rec.partition

    @property
    def offset(self) -> int:
        return self._rec.offset

    @property
    def timestamp(self) -> int:
        """The record's Kafka timestamp, ms since the epoch."""
        return self._rec.timestamp

    @property
    def headers(self) -> Sequence[Header]:
        return self._rec.headers

    @property
    def raw_key(self) -> bytes | None:
        return self._rec.key

    def send(self, topic: Any, key: Any, value: Any, headers: Sequence[Header] = ()) -> None:
        """Produce (topic, key, value), placed by linear hashing over the topic's layout.

        Output carries `streamkit.source` = "topic/partition/offset" of the input record so
        a downstream consumer can drop the duplicates that at-least-once output may bring.
        """
        rec = self._rec
        hdrs = list(headers)
        hdrs.append(("streamkit.source", f"{rec.topic}/{rec.partition}/{rec.offset}".encode()))
        self._outbox.add(topic, key, value, hdrs, self.processor)

    def write(self, sink: Any, row: dict[str, Any]) -> None:
        """Write ``row`` (column -> JSON value) to ``sink`` (``app.sink``): it is written
        with the processor's next checkpoint, exactly once (``streamkit.sinks``). A row the
        sink could never write (a column its table lacks) raises here (``Sink.check``),
        given the sink itself rather than its name: the record is then a dead letter."""
        if isinstance(sink, str):
            self._outbox.write(self.processor, sink, row)
        else:
            sink.check(row)
            self._outbox.write(self.processor, sink.name, row)


class ReplayRecord:
    """The minimal record shape the offline replay hands to Context."""

    __slots__ = ("topic", "partition", "offset", "timestamp", "headers", "key", "value")

    def __init__(
        self, topic: str, partition: int, offset: int, timestamp: int, key: bytes | None, value: bytes | None
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.timestamp = timestamp
        self.headers: Sequence[Header] = ()
        self.key = key
        self.value = value
