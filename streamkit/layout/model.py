"""Topic layouts: the per-topic source of truth for placement, as immutable values.

A layout (DESIGN.md "layout"; seed 000's ``initial_partition_count`` /
``undeleted_partition_count``, seed 004's partition modes, seed 002's topic epoch)
holds, per topic:

- ``n0``: the initial partition count (linear hashing's N0; never changes);
- ``active``: the count of partitions producers write to (linear hashing's N);
- ``physical``: the partitions the broker has (reserved capacity may exceed ``active``);
- ``modes``: one :class:`PartitionMode` per physical partition.  Invariant: partition
  ``p`` is ``READ_WRITE`` iff ``p < active``; partitions being drained after a shrink
  are ``READ_ONLY``; the rest (reserved, or drained and given up) are ``NONE``;
- ``seals``: the history of changes, one :class:`Seal` per change, oldest first;
- ``epoch``: grows by exactly one at every change (creation is epoch 1);
- ``ordered_delivery``: seed 000's per-topic ``enable.ordered.delivery`` switch.

Transitions are pure functions returning the next layout (epoch + 1) or raising a
:class:`LayoutError` whose message says what to do:

- :func:`create` (epoch 1), :func:`expand`, :func:`shrink`, :func:`finish_drain`,
  :func:`set_ordered_delivery`;
- :func:`seal` completes an announced expand/shrink (same epoch; see below).

Expand and shrink are two-phase (``streamkit.layout.protocol``).  :func:`expand` and
:func:`shrink` return an *announced* layout: its last seal carries the
``announce_offsets`` (every partition's fetch high watermark read just before the
announcement was written) but no ``seal_offsets``.  Producers switch on seeing it and
acknowledge; then :func:`seal` records ``seal_offsets`` (every partition's high
watermark after all acknowledgements) and the change is complete.  The *version* of a
layout is ``(epoch, 0 if announced else 1)``; readers keep the highest.

What the two offset maps mean, per partition ``p`` of a change at epoch ``e``:

- ``announce_offsets[p]``: no record stamped with an epoch ``>= e`` lies below it
  (producers could not switch before the announcement existed).  For a partition
  created by an expansion it is the first offset of its new incarnation (older
  records there are dead leftovers of a previous incarnation).
- ``seal_offsets[p]``: no record stamped with an epoch ``< e`` from a producer that
  acknowledged ``e`` lies at or beyond it.  A record stamped ``< e`` at or beyond it
  is *late* (its producer missed the change; see ``streamkit.layout.gating``).
"""

from __future__ import annotations

import enum
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "ChangeKind",
    "LayoutError",
    "PartitionMode",
    "PendingChangeError",
    "Seal",
    "TopicLayout",
    "check_expand",
    "check_shrink",
    "create",
    "expand",
    "finish_drain",
    "seal",
    "set_ordered_delivery",
    "shrink",
]


class LayoutError(ValueError):
    """A layout change that is not allowed; the message says why and what to do."""


class PendingChangeError(LayoutError):
    """Another change of the topic is announced but not sealed yet."""


class PartitionMode(enum.IntEnum):
    """Seed 004's partition modes (codes as in its PartitionRecord)."""

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


# ---------------------------------------------------------------------- transitions


def _modes(active: int, physical: int, read_only: Iterable[int] = ()) -> tuple[PartitionMode, ...]:
    ro = set(read_only)
    return tuple(
        PartitionMode.READ_WRITE if p < active else PartitionMode.READ_ONLY if p in ro else PartitionMode.NONE
        for p in range(physical)
    )


def _require_settled(layout: TopicLayout, what: str) -> None:
    pend = layout.pending
    if pend is not None:
        raise PendingChangeError(
            f"cannot {what} {layout.topic}: its {pend.kind.value} to epoch {pend.epoch} is announced "
            f"but not sealed yet; finish it first (streamkit topics resume {layout.topic})"
        )


def create(
    topic: str,
    partitions: int,
    *,
    capacity: int | None = None,
    ordered_delivery: bool = True,
    now_ms: int | None = None,
    change_id: str | None = None,
) -> TopicLayout:
    """The first layout of ``topic``: ``partitions`` active (= n0) of ``capacity`` physical."""
    capacity = partitions if capacity is None else capacity
    if partitions < 1:
        raise LayoutError(f"{topic}: --partitions must be >= 1, got {partitions}")
    if capacity < partitions:
        raise LayoutError(f"{topic}: --capacity ({capacity}) must be >= --partitions ({partitions})")
    ts = _now_ms() if now_ms is None else now_ms
    s = Seal(
        epoch=1,
        kind=ChangeKind.CREATE,
        old_active=partitions,
        new_active=partitions,
        partitions=tuple(range(partitions)),
        change_id=change_id or uuid.uuid4().hex,
        ts_ms=ts,
    )
    return TopicLayout(
        topic=topic,
        n0=partitions,
        active=partitions,
        physical=capacity,
        modes=_modes(partitions, capacity),
        epoch=1,
        seals=(s,),
        ordered_delivery=ordered_delivery,
    )


def check_expand(layout: TopicLayout, n2: int, *, physical: int | None = None) -> None:
    """Raise the :class:`LayoutError` that :func:`expand` would raise (nothing if allowed).

    ``physical`` None: the physical count is not checked yet (it may still grow)."""
    _require_settled(layout, "expand")
    t = layout.topic
    if layout.draining:
        dl = [layout.drain_deadline_ms(p) for p in layout.draining]
        due = max((d for d in dl if d is not None), default=None)
        when = (
            f" (may be given up after {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(due / 1000))})" if due else ""
        )
        raise LayoutError(
            f"cannot expand {t}: partitions {list(layout.draining)} are still draining from a shrink{when}; "
            f"wait until they are drained (streamkit topics finish-drain {t})"
        )
    if n2 <= layout.active:
        hint = " (use shrink to reduce)" if n2 < layout.active else ""
        raise LayoutError(f"cannot expand {t} to {n2} partitions: it already has {layout.active} active{hint}")
    if physical is None:
        return
    phys = physical
    if phys < layout.physical:
        raise LayoutError(f"{t}: the physical partition count cannot decrease ({layout.physical} -> {phys})")
    if n2 > phys:
        raise LayoutError(
            f"cannot expand {t} to {n2} partitions: it has only {phys} physical partitions; "
            f"add partitions first (CreatePartitions) or create the topic with --capacity >= {n2}"
        )


def expand(
    layout: TopicLayout,
    n2: int,
    *,
    physical: int | None = None,
    announce_offsets: Mapping[int, int] | None = None,
    now_ms: int | None = None,
    change_id: str | None = None,
) -> TopicLayout:
    """Announce growing the active count to ``n2`` (epoch + 1, unsealed).

    ``physical``: the topic's physical partition count if it grew (CreatePartitions).
    ``announce_offsets``: every partition's high watermark read before announcing.
    Refused while another change is pending or while partitions still drain (seed 000:
    no expansion while a partition is marked for deletion).
    """
    phys = layout.physical if physical is None else physical
    check_expand(layout, n2, physical=phys)
    ts = _now_ms() if now_ms is None else now_ms
    s = Seal(
        epoch=layout.epoch + 1,
        kind=ChangeKind.EXPAND,
        old_active=layout.active,
        new_active=n2,
        partitions=tuple(range(layout.active, n2)),
        announce_offsets=_offsets(announce_offsets),
        seal_offsets=None,
        change_id=change_id or uuid.uuid4().hex,
        ts_ms=ts,
    )
    return replace(
        layout,
        active=n2,
        physical=phys,
        modes=_modes(n2, phys),
        epoch=s.epoch,
        seals=layout.seals + (s,),
    )


def check_shrink(layout: TopicLayout, n2: int, delay: float = 0.0) -> None:
    """Raise the :class:`LayoutError` that :func:`shrink` would raise (nothing if allowed)."""
    _require_settled(layout, "shrink")
    t = layout.topic
    if n2 >= layout.active:
        hint = " (use expand to grow)" if n2 > layout.active else ""
        raise LayoutError(f"cannot shrink {t} to {n2} partitions: it has {layout.active} active{hint}")
    if n2 < layout.n0:
        raise LayoutError(
            f"cannot shrink {t} to {n2} partitions: below its initial count {layout.n0} "
            "(linear hashing places keys over the initial count)"
        )
    if delay < 0:
        raise LayoutError(f"{t}: --delay must be >= 0, got {delay}")


def shrink(
    layout: TopicLayout,
    n2: int,
    delay: float = 0.0,
    *,
    announce_offsets: Mapping[int, int] | None = None,
    now_ms: int | None = None,
    change_id: str | None = None,
) -> TopicLayout:
    """Announce reducing the active count to ``n2`` (epoch + 1, unsealed).

    Partitions ``n2 .. active-1`` become ReadOnly: producers stop writing there,
    consumers drain them.  They may be given up (:func:`finish_drain`) ``delay``
    seconds after the change at the earliest, or earlier with ``force`` once every
    group drained them.  ``n2`` must be >= n0 (linear hashing has no count below it).
    """
    check_shrink(layout, n2, delay)
    ts = _now_ms() if now_ms is None else now_ms
    gone = tuple(range(n2, layout.active))
    s = Seal(
        epoch=layout.epoch + 1,
        kind=ChangeKind.SHRINK,
        old_active=layout.active,
        new_active=n2,
        partitions=gone,
        announce_offsets=_offsets(announce_offsets),
        seal_offsets=None,
        drain_deadline_ms=ts + int(delay * 1000),
        change_id=change_id or uuid.uuid4().hex,
        ts_ms=ts,
    )
    return replace(
        layout,
        active=n2,
        modes=_modes(n2, layout.physical, set(layout.draining) | set(gone)),
        epoch=s.epoch,
        seals=layout.seals + (s,),
    )


def seal(
    layout: TopicLayout,
    seal_offsets: Mapping[int, int],
    *,
    fenced: Iterable[str] = (),
) -> TopicLayout:
    """Complete the pending expansion or shrink with its seal offsets (same epoch)."""
    pend = layout.pending
    if pend is None:
        raise LayoutError(f"{layout.topic}: no announced change to seal (epoch {layout.epoch} is settled)")
    offs = _offsets(seal_offsets)
    for p, o in offs:
        a = pend.announce_offset(p)
        if a is not None and o < a:
            raise LayoutError(f"{layout.topic}: seal offset {o} of partition {p} is below its announce offset {a}")
    s = replace(pend, seal_offsets=offs, fenced=tuple(sorted(set(fenced))))
    return replace(layout, seals=layout.seals[:-1] + (s,))


def finish_drain(
    layout: TopicLayout,
    partition: int | Iterable[int],
    *,
    now_ms: int | None = None,
    force: bool = False,
    change_id: str | None = None,
) -> TopicLayout:
    """Give up draining partition(s): ReadOnly -> None (epoch + 1, one change).

    Refused before the shrink's deadline unless ``force`` (use it once every consumer
    group has consumed the partition to its seal, e.g. ``topics finish-drain --group``).
    Records a group had not consumed by then are not delivered (seed 004's delayed
    deletion); surviving partitions stop waiting for them.
    """
    _require_settled(layout, "finish draining")
    parts = (partition,) if isinstance(partition, int) else tuple(sorted(set(partition)))
    if not parts:
        raise LayoutError(f"{layout.topic}: no partition to finish draining")
    ts = _now_ms() if now_ms is None else now_ms
    for p in parts:
        if layout.mode(p) != PartitionMode.READ_ONLY:
            raise LayoutError(f"{layout.topic}: partition {p} is {layout.mode(p).label}, not draining (ReadOnly)")
        dl = layout.drain_deadline_ms(p)
        if not force and dl is not None and ts < dl:
            raise LayoutError(
                f"{layout.topic}: partition {p} drains for {(dl - ts) / 1000:.1f} s more; "
                "wait, or force it once every group consumed it (--group G)"
            )
    s = Seal(
        epoch=layout.epoch + 1,
        kind=ChangeKind.FINISH,
        old_active=layout.active,
        new_active=layout.active,
        partitions=parts,
        change_id=change_id or uuid.uuid4().hex,
        ts_ms=ts,
    )
    return replace(
        layout,
        modes=_modes(layout.active, layout.physical, set(layout.draining) - set(parts)),
        epoch=s.epoch,
        seals=layout.seals + (s,),
    )


def set_ordered_delivery(
    layout: TopicLayout, enabled: bool, *, now_ms: int | None = None, change_id: str | None = None
) -> TopicLayout:
    """Turn seed 000's ordered delivery on or off for the topic (epoch + 1)."""
    _require_settled(layout, "reconfigure")
    s = Seal(
        epoch=layout.epoch + 1,
        kind=ChangeKind.CONFIG,
        old_active=layout.active,
        new_active=layout.active,
        change_id=change_id or uuid.uuid4().hex,
        ts_ms=_now_ms() if now_ms is None else now_ms,
    )
    return replace(layout, ordered_delivery=enabled, epoch=s.epoch, seals=layout.seals + (s,))
