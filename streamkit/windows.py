"""Window definitions for windowed tables."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tumbling:
    """Fixed, non-overlapping windows of `size` seconds aligned to the epoch."""

    size: float

    def __post_init__(self) -> None:
        if self.size <= 0:
            raise ValueError(f"Tumbling window size must be > 0 seconds, got {self.size!r}")

    @property
    def size_ms(self) -> int:
        return int(self.size * 1000)

    def start_of(self, timestamp_ms: int) -> int:
        """Start (ms since the epoch) of the window holding `timestamp_ms`."""
        return timestamp_ms - timestamp_ms % self.size_ms
