"""Topic layouts: the per-topic source of truth for placement, as immutable values.

A layout (KIP-253's ``initial_partition_count`` / ``undeleted_partition_count``,
the partition modes of partition reduction, KIP-232's topic epoch; docs/design.md)
holds, per topic:

- ``n0``: the initial partition count (linear hashing's N0; never changes);
- ``active``: the count of partitions producers write to (linear hashing's N);
- ``physical``: the partitions the broker has (reserved capacity may exceed ``active``);
- ``modes``: one :class:`PartitionMode` per physical partition.  Invariant: partition
  ``p`` is ``READ_WRITE`` iff ``p < active``; partitions being drained after a shrink
  are ``READ_ONLY``; the rest (reserved, or drained and given up) are ``NONE``;
- ``seals``: the history of changes, one :class:`Seal` per change, oldest first;
- ``epoch``: grows by exactly one at every change (creation is epoch 1);
- ``ordered_delivery``: KIP-253's per-topic ``enable.ordered.delivery`` switch.

The transitions between layouts are in ``streamkit.layout.transitions``.

What the two offset maps of a change mean, per partition ``p`` of a change at epoch ``e``:

- ``announce_offsets[p]``: no record stamped with an epoch ``>= e`` lies below it
  (producers could not switch before the announcement existed).  For a partition
  created by an expansion it is the first offset of its new incarnation (older
  records there are dead leftovers of a previous incarnation).
- ``seal_offsets[p]``: no record stamped with an epoch ``< e`` from a producer that
  acknowledged ``e`` lies at or beyond it.  A record stamped ``< e`` at or beyond it
  is *late* (its producer missed the change; see ``streamkit.layout.stamps``).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ChangeKind",
    "LayoutError",
    "PartitionMode",
    "PendingChangeError",
    "Seal",
    "TopicLayout",
]


class LayoutError(ValueError):
    """A layout change that is not allowed; the message says why and what to do."""


class PendingChangeError(LayoutError):
    """Another change of the topic is announced but not sealed yet."""


class PartitionMode(enum.IntEnum):
    """The partition modes of partition reduction (docs/design.md)."""

    READ_WRITE = 0
    """Producers write, consumers read."""
    READ_ONLY = 1
    """Draining after a shrink: producers skip it, consumers still read it."""
    NONE = -1
    """Reserved capacity, or drained and given up: nobody reads or writes it."""

    @property
    def label(self) -> str:
        return {0: "ReadWrite", 1: "ReadOnly", -1: "None"}[int(self)]


class ChangeKind(str, enum.Enum):
    CREATE = "create"
    EXPAND = "expand"
    SHRINK = "shrink"
    FINISH = "finish"
    """Draining partitions go ReadOnly -> None."""
    CONFIG = "config"
    """A setting changed (ordered delivery); placement unchanged."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def _offsets(m: Mapping[int, int] | Iterable[tuple[int, int]] | None) -> tuple[tuple[int, int], ...]:
    if m is None:
        return ()
    items = m.items() if isinstance(m, Mapping) else m
    out = tuple(sorted((int(p), int(o)) for p, o in items))
    for p, o in out:
        if p < 0 or o < 0:
            raise LayoutError(f"offsets must be non-negative, got partition {p} -> {o}")
    return out


@dataclass(frozen=True)
class Seal:
    """One change in a topic's history (creation, expansion, shrink, drain end, config).

    For an expansion or shrink, ``announce_offsets`` and ``seal_offsets`` are the
    offset maps described in the module docstring (as sorted ``(partition, offset)``
    tuples; use :meth:`announce_offset` / :meth:`seal_offset`).  ``seal_offsets`` is
    None while the change is announced but not sealed.
    """

    epoch: int
    kind: ChangeKind
    old_active: int
    new_active: int
    partitions: tuple[int, ...] = ()
    """Created (expand), marked ReadOnly (shrink), set to None (finish)."""
    announce_offsets: tuple[tuple[int, int], ...] = ()
    seal_offsets: tuple[tuple[int, int], ...] | None = ()
    drain_deadline_ms: int | None = None
    """Shrink: wall-clock ms after which the drained partitions may be given up."""
    fenced: tuple[str, ...] = ()
    """Producer ids that did not acknowledge before the deadline (informational)."""
    change_id: str = ""
    ts_ms: int = 0

    @property
    def sealed(self) -> bool:
        return self.seal_offsets is not None

    def announce_offset(self, p: int) -> int | None:
        for q, o in self.announce_offsets:
            if q == p:
                return o
        return None

    def seal_offset(self, p: int) -> int | None:
        for q, o in self.seal_offsets or ():
            if q == p:
                return o
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "kind": self.kind.value,
            "old_active": self.old_active,
            "new_active": self.new_active,
            "partitions": list(self.partitions),
            "announce_offsets": [list(x) for x in self.announce_offsets],
            "seal_offsets": None if self.seal_offsets is None else [list(x) for x in self.seal_offsets],
            "drain_deadline_ms": self.drain_deadline_ms,
            "fenced": list(self.fenced),
            "change_id": self.change_id,
            "ts_ms": self.ts_ms,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Seal:
        so = d.get("seal_offsets", [])
        return cls(
            epoch=int(d["epoch"]),
            kind=ChangeKind(d["kind"]),
            old_active=int(d["old_active"]),
            new_active=int(d["new_active"]),
            partitions=tuple(int(p) for p in d.get("partitions", ())),
            announce_offsets=_offsets([tuple(x) for x in d.get("announce_offsets", ())]),
            seal_offsets=None if so is None else _offsets([tuple(x) for x in so]),
            drain_deadline_ms=d.get("drain_deadline_ms"),
            fenced=tuple(d.get("fenced", ())),
            change_id=str(d.get("change_id", "")),
            ts_ms=int(d.get("ts_ms", 0)),
        )


@dataclass(frozen=True)
class TopicLayout:
    """A topic's layout at one epoch (see the module docstring).  Validated on creation."""

    topic: str
    n0: int
    active: int
    physical: int
    modes: tuple[PartitionMode, ...]
    epoch: int
    seals: tuple[Seal, ...] = field(default=())
    ordered_delivery: bool = True

    def __post_init__(self) -> None:
        if not self.topic:
            raise LayoutError("a layout needs a topic name")
        if self.n0 < 1:
            raise LayoutError(f"{self.topic}: the initial partition count must be >= 1, got {self.n0}")
        if not self.n0 <= self.active <= self.physical:
            raise LayoutError(
                f"{self.topic}: need n0 <= active <= physical, got {self.n0}, {self.active}, {self.physical}"
            )
        if len(self.modes) != self.physical:
            raise LayoutError(f"{self.topic}: {len(self.modes)} modes for {self.physical} partitions")
        modes = tuple(PartitionMode(m) for m in self.modes)
        object.__setattr__(self, "modes", modes)
        for p, m in enumerate(modes):
            if (m == PartitionMode.READ_WRITE) != (p < self.active):
                raise LayoutError(f"{self.topic}: partition {p} is {m.label} but the active count is {self.active}")
        if self.epoch < 1:
            raise LayoutError(f"{self.topic}: epoch must be >= 1, got {self.epoch}")
        if self.seals:
            epochs = [s.epoch for s in self.seals]
            if any(b <= a for a, b in zip(epochs, epochs[1:])) or epochs[-1] != self.epoch:
                raise LayoutError(f"{self.topic}: seal epochs {epochs} must increase and end at {self.epoch}")
            if any(not s.sealed for s in self.seals[:-1]):
                raise LayoutError(f"{self.topic}: only the last change may be unsealed")

    # ------------------------------------------------------------------ views

    @property
    def version(self) -> tuple[int, int]:
        """``(epoch, 0 if a change is announced but unsealed else 1)``; higher is newer."""
        return (self.epoch, 0 if self.pending is not None else 1)

    @property
    def pending(self) -> Seal | None:
        """The announced, not yet sealed change (None when the layout is settled)."""
        if self.seals and not self.seals[-1].sealed:
            return self.seals[-1]
        return None

    @property
    def change_ids(self) -> tuple[str, ...]:
        return tuple(s.change_id for s in self.seals)

    def mode(self, p: int) -> PartitionMode:
        return self.modes[p] if 0 <= p < self.physical else PartitionMode.NONE

    @property
    def writable(self) -> tuple[int, ...]:
        return tuple(range(self.active))

    @property
    def draining(self) -> tuple[int, ...]:
        return tuple(p for p, m in enumerate(self.modes) if m == PartitionMode.READ_ONLY)

    @property
    def readable(self) -> tuple[int, ...]:
        """ReadWrite and ReadOnly partitions: those consumers read."""
        return tuple(p for p, m in enumerate(self.modes) if m != PartitionMode.NONE)

    def drain_deadline_ms(self, p: int) -> int | None:
        """When draining partition ``p`` may be given up (its shrink's deadline)."""
        if self.mode(p) != PartitionMode.READ_ONLY:
            return None
        for s in reversed(self.seals):
            if s.kind == ChangeKind.SHRINK and p in s.partitions:
                return s.drain_deadline_ms
        return None

    def base_offset(self, p: int) -> int:
        """First offset of partition ``p``'s current incarnation.

        0 for partitions that never were re-created; for a partition (re)activated by
        an expansion, the high watermark it had when that expansion was announced
        (records below are leftovers of an earlier incarnation: skip them).
        """
        for s in reversed(self.seals):
            if s.kind == ChangeKind.EXPAND and p in s.partitions:
                return s.announce_offset(p) or 0
            if s.kind == ChangeKind.CREATE and p in s.partitions:
                return s.announce_offset(p) or 0
        return 0

    def active_at(self, epoch: int) -> int:
        """The active partition count of this topic's layout at ``epoch`` (from the seals).

        For an epoch older than the kept history, the oldest known count is returned.
        """
        count = self.seals[0].old_active if self.seals else self.active
        for s in self.seals:
            if s.epoch > epoch:
                break
            count = s.new_active
        return count

    # ------------------------------------------------------------------ serialisation

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "n0": self.n0,
            "active": self.active,
            "physical": self.physical,
            "modes": [int(m) for m in self.modes],
            "epoch": self.epoch,
            "ordered_delivery": self.ordered_delivery,
            "seals": [s.to_dict() for s in self.seals],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TopicLayout:
        try:
            return cls(
                topic=str(d["topic"]),
                n0=int(d["n0"]),
                active=int(d["active"]),
                physical=int(d["physical"]),
                modes=tuple(PartitionMode(int(m)) for m in d["modes"]),
                epoch=int(d["epoch"]),
                seals=tuple(Seal.from_dict(s) for s in d.get("seals", ())),
                ordered_delivery=bool(d.get("ordered_delivery", True)),
            )
        except (KeyError, TypeError) as exc:
            raise LayoutError(f"malformed layout: {exc!r}") from None

    def describe(self) -> str:
        pend = f", change to epoch {self.epoch} announced" if self.pending else ""
        drain = f", draining {list(self.draining)}" if self.draining else ""
        return (
            f"{self.topic}: epoch {self.epoch}, n0={self.n0}, active={self.active}, "
            f"physical={self.physical}{drain}{pend}"
        )
