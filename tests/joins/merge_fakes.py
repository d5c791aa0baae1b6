"""Plain stand-ins for what the time-ordered merge reads of records, processors and
routes (its tests are of pure logic; the worker tests run the real ones)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    offset: int
    timestamp: int


@dataclass(eq=False)
class Proc:
    id: int
    pending: dict[Any, set[int]] = field(default_factory=dict)
    sides: Any = None
    commit_gate: Any = None


@dataclass(eq=False)
class FakeRoute:
    proc: Proc
    position_key: tuple[str, int]
    position: int = 0
    limit: int | None = None
    scheduler: Any = None
    swept: bool = False
