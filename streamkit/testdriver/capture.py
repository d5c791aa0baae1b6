"""What a test driver's app sent: a producer that keeps every record instead of writing
it to a broker, and the records as a test reads them back (decoded with the topic's serdes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from streamkit.context import Header
from streamkit.topics import Topic

__all__ = ["CaptureProducer", "DeadLetter", "OutputRecord", "Sent"]


@dataclass(frozen=True)
class Sent:
    """One record as the app handed it to its producer (encoded)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    timestamp_ms: int | None


class CaptureProducer:
    """Stands where the worker's producer stands (``streamkit.runtime.output.Output``
    sends through it): keeps what is sent, in order. Every send is acknowledged at once."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []

    async def send(
        self,
        topic: str,
        key: Any,
        value: Any,
        headers: Sequence[Header] | None = None,
        *,
        timestamp_ms: int | None = None,
    ) -> None:
        self.sent.append(Sent(topic, key, value, tuple(headers or ()), timestamp_ms))

    async def flush(self) -> None:
        return None


@dataclass(frozen=True)
class OutputRecord:
    """A record the app sent to an output topic, decoded with the topic's serdes."""

    key: Any
    value: Any
    headers: tuple[Header, ...]

    @property
    def source(self) -> str | None:
        """``topic/partition/offset`` of the input record it was sent for (None: a timer's)."""
        found = dict(self.headers).get("streamkit.source")
        return found.decode() if found is not None else None


@dataclass(frozen=True)
class DeadLetter:
    """An input record the app could not handle, with why (``reason``: ``handler``,
    ``value-decode``, ``key-decode``, ``late``, ...) and the error's text."""

    reason: str
    error: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    handler: str = ""


def decode_output(sent: Sent, topic: Topic) -> OutputRecord:
    key = topic.key_serde.loads(sent.key) if sent.key is not None else None
    value = topic.value_serde.loads(sent.value) if sent.value is not None else None
    return OutputRecord(key, value, sent.headers)


def decode_dead_letter(sent: Sent) -> DeadLetter:
    h: Mapping[str, bytes] = dict(sent.headers)
    return DeadLetter(
        reason=h.get("streamkit.error.reason", b"").decode(),
        error=h.get("streamkit.error.exception", b"").decode(),
        topic=h.get("streamkit.source.topic", b"").decode(),
        partition=int(h.get("streamkit.source.partition", b"-1")),
        offset=int(h.get("streamkit.source.offset", b"-1")),
        key=sent.key,
        value=sent.value,
        handler=h.get("streamkit.error.handler", b"").decode(),
    )
