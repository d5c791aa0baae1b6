"""Transitions between topic layouts: pure functions returning the next layout.

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

The ``check_*`` functions raise what the transition would raise, without building it:
the coordinator validates a change before it reads any offsets.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import replace

from streamkit.layout.model import (
    ChangeKind,
    LayoutError,
    PartitionMode,
    PendingChangeError,
    Seal,
    TopicLayout,
    _now_ms,
    _offsets,
)

__all__ = [
    "check_expand",
    "check_shrink",
    "create",
    "expand",
    "finish_drain",
    "seal",
    "set_ordered_delivery",
    "shrink",
]


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
    Refused while another change is pending or while partitions still drain (KIP-253:
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
    Records a group had not consumed by then are not delivered (partition reduction's delayed
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
    """Turn KIP-253's ordered delivery on or off for the topic (epoch + 1)."""
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
