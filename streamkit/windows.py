"""Window definitions for windowed tables, and when a window closes and expires.

Time is the processor's **stream time**: the largest record timestamp it has applied
(checkpointed with its state, so a restart decides exactly as the first run did). A
window ``[start, start + size)`` accepts records until stream time reaches its end plus
``grace``; a record for a closed window is late (a dead letter, reason ``late``). It is
kept for reads until its end plus ``retention``, then deleted at a checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamkit.errors import StreamkitError

DEFAULT_RETENTION = 24 * 3600.0
"""Seconds a window is kept after its end (and, by default, accepts late records): a day,
as Kafka Streams' defaults were."""


class LateRecordError(StreamkitError):
    """A record for a window that has closed (stream time passed its end plus grace)."""


@dataclass(frozen=True)
class Tumbling:
    """Fixed, non-overlapping windows of ``size`` seconds aligned to the epoch; records
    are accepted ``grace`` seconds after a window's end, and the window is kept
    ``retention`` seconds after its end (at least ``grace``)."""

    size: float
    grace: float = DEFAULT_RETENTION
    retention: float = DEFAULT_RETENTION

    def __post_init__(self) -> None:
        if self.size <= 0:
            raise ValueError(f"Tumbling window size must be > 0 seconds, got {self.size!r}")
        if self.grace < 0:
            raise ValueError(f"Tumbling window grace must be >= 0 seconds, got {self.grace!r}")
        if self.retention < self.grace:
            raise ValueError(
                f"Tumbling window retention ({self.retention!r} s) must be at least its grace ({self.grace!r} s): "
                "a window must be kept while it accepts records"
            )

    @property
    def size_ms(self) -> int:
        return int(self.size * 1000)

    def start_of(self, timestamp_ms: int) -> int:
        """Start (ms since the epoch) of the window holding `timestamp_ms`."""
        return timestamp_ms - timestamp_ms % self.size_ms

    def closed(self, start_ms: int, stream_time_ms: int) -> bool:
        """The window starting at ``start_ms`` accepts no more records."""
        return start_ms + self.size_ms + int(self.grace * 1000) <= stream_time_ms

    def expired(self, start_ms: int, stream_time_ms: int) -> bool:
        """The window starting at ``start_ms`` is past its retention: delete it."""
        return start_ms + self.size_ms + int(self.retention * 1000) <= stream_time_ms
