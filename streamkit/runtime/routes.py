"""Where the records of one assigned partition go, and what admission knows of it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from assignors.linear_hashing import bucket_modulus
from assignors.placement import KeyFilter
from stores.serde import JsonSerde, RawSerde, Serde
from streamkit.app import HandlerSpec
from streamkit.layout.model import TopicLayout
from streamkit.layout.stamps import epoch_bytes
from streamkit.layout.strays import StrayRule, stray_rule
from streamkit.runtime.keyorder import KeyScheduler
from streamkit.runtime.processor import Position, ProcessorState


def decoder(serde: Serde) -> Callable[[bytes], Any] | None:
    """The fastest callable that decodes like `serde.loads` (orjson's C function for JSON),
    or None for raw bytes: a record's key and value are bytes already, taken as they are."""
    if type(serde) is JsonSerde:
        return orjson.loads
    if type(serde) is RawSerde:
        return None
    return serde.loads


def epoch_stamp(layout: TopicLayout | None) -> bytes | None:
    """What follows the producer tag in the stamp of records that pass unchecked
    (None: no checks)."""
    if layout is None or not layout.ordered_delivery:
        return None
    return epoch_bytes(layout.epoch)


def mixed_history_end(layout: TopicLayout | None, partition: int) -> int | None:
    """The offset from which a partition holds only keys of its current class: its last
    seal (0: it never held others). Below it the partition held the keys of a wider
    class (before a split) or of partitions merged into it; a processor that owns the
    whole partition now may not own all of those. None: a change touching it is not
    sealed yet (every record may be of either class)."""
    if layout is None:
        return 0
    end = 0
    for seal in layout.seals:
        if not seal.sealed:
            if seal.announce_offset(partition) is not None or partition in seal.partitions:
                return None
            continue
        offset = seal.seal_offset(partition)
        if offset is not None:
            end = max(end, offset)
    return end


def sealed_history_end(layout: TopicLayout | None, partition: int) -> int:
    """The partition's last seal among the sealed changes (0: none), whatever change is
    announced and not sealed yet: below it the partition's history is settled."""
    if layout is None:
        return 0
    offsets = (seal.seal_offset(partition) for seal in layout.seals if seal.sealed)
    return max((o for o in offsets if o is not None), default=0)


def rebuilt_all(proc: Any, routes: Iterable[tuple[Any, Route]]) -> bool:
    """Whether ``proc`` has applied, on every partition ``routes`` give it, each record the
    group handled already (``rebuild_until``), none still held (``Route.stable``)."""
    return all(r.stable >= r.rebuild_until for _, r in routes if r.proc is proc)


class SlotPlace(NamedTuple):
    """Where an assigned slot's keys are: its key filter and sharers (a shared task; none:
    a whole partition) and the job's processor counts."""

    key_filter: KeyFilter | None
    sharers: tuple[int, ...]
    p0: int
    p: int


@dataclass
class Route:
    """One assigned partition: its processor, handlers, decoders and admission state."""

    proc: ProcessorState
    handlers: list[HandlerSpec]
    key_loads: Callable[[bytes], Any] | None
    """None: keys are used as the raw bytes they are."""
    value_loads: Callable[[bytes], Any] | None
    position_key: Position
    rebuild_until: int  # offsets below this were already handled by the group: emit nothing
    committed: int  # the group's committed offset as last known
    layout: TopicLayout | None = None
    epoch_bytes: bytes | None = None  # the layout epoch as stamped: records carrying it pass
    limit: int | None = None  # gate: deliver offsets below it only
    stale_epoch: int | None = None  # a record named a newer layout epoch than ours
    hole: tuple[int, int, float, int] | None = None  # (start, next offset, first seen, fetches): Admission.cut_at_hole
    key_filter: KeyFilter | None = None
    """Only records whose key hash it accepts are applied (None: every record)."""
    null_keys: bool = True
    """With a key filter: whether records without a key are applied (the partition's owner)."""
    sharers: tuple[int, ...] = ()
    """A shared task: every processor sharing the partition by key range (empty: whole)."""
    scheduler: KeyScheduler | None = None
    """Key-level concurrency (live routes of handlers with ``concurrency`` > 1)."""
    filter_until: int | None = None
    """With a key filter: records at or beyond this offset are all the processor's and
    pass unfiltered (None: every record is filtered)."""
    strays: StrayRule | None = None
    """Which unstamped records lie where the layout does not place them (None: none can)."""
    swept: bool = False
    """A partition no layout reads (mode None): every record is a stray, no gate."""
    forwarded: frozenset[int] = frozenset()
    """Offsets of strays whose forwarded copies exist already (sent by a sweep that died
    before its checkpoint, ``copies.find_copies``): not forwarded again."""
    stamps_current: set[bytes] = field(default_factory=set)
    """Stamp values seen carrying ``epoch_bytes`` (one per producer): a record with one of
    them passes on a set lookup (emptied when the epoch changes)."""

    @property
    def position(self) -> int:
        """The next offset this partition's processor will apply."""
        return self.proc.positions[self.position_key]

    @position.setter
    def position(self, offset: int) -> None:
        self.proc.positions[self.position_key] = offset

    @property
    def stable(self) -> int:
        """Every record below this offset is applied: the position, or the lowest record a
        key-concurrent route handed over and has not finished (or the time-ordered merge
        holds)."""
        pending = self.proc.pending.get(self.position_key)  # key-concurrent, or held by the time-ordered merge
        return min(pending) if pending else self.position

    @classmethod
    def build(
        cls,
        proc: ProcessorState,
        handlers: list[HandlerSpec],
        partition: Position,
        group_position: int,
        layout: TopicLayout | None,
        sweep_ends: Mapping[int, int] | None = None,
    ) -> Route:
        """The route of `partition` for `proc`, which resumes at its own checkpoint and
        rebuilds without output up to where the group already was. ``sweep_ends``: where
        the group's sweeps of the partition ended (``strays.stray_rule``)."""
        pos = proc.positions.setdefault(partition, 0)
        topic = handlers[0].topic
        return cls(
            proc,
            handlers,
            decoder(topic.key_serde),
            decoder(topic.value_serde),
            partition,
            max(pos, group_position),
            group_position,
            layout,
            epoch_stamp(layout),
            strays=stray_rule(layout, partition[1], sweep_ends=sweep_ends),
        )

    @classmethod
    def sweeping(
        cls, proc: ProcessorState, handlers: list[HandlerSpec], partition: Position, group_position: int,
        layout: TopicLayout | None,
    ) -> Route:  # fmt: skip
        """The route of a partition ``proc`` reads only to forward its strays: it starts
        where the group's sweep was (what lies below was forwarded)."""
        route = cls.build(proc, handlers, partition, group_position, layout)
        route.position = route.rebuild_until
        route.swept = True
        route.strays = stray_rule(layout, partition[1], swept=True)
        return route

    @classmethod
    def for_slot(
        cls,
        proc: ProcessorState,
        handlers: list[HandlerSpec],
        partition: Position,
        group_position: int,
        layout: TopicLayout | None,
        place: SlotPlace,
        *,
        max_pending: int = 10_000,
        sweep_ends: Mapping[int, int] | None = None,
    ) -> Route:
        """The route of one assigned slot: a shared task applies only the processor's key
        range of the partition (keyless records going to the lowest sharer); a whole
        partition whose history holds keys of a wider class filters by the processor's
        keys up to the end of that history."""
        route = cls.build(proc, handlers, partition, group_position, layout, sweep_ends)
        if handlers[0].concurrency > 1:
            route.scheduler = KeyScheduler(handlers[0].concurrency, max_pending)
            proc.pending[partition] = route.scheduler.pending
        if sharers := place.sharers:
            route.key_filter, route.sharers, route.null_keys = place.key_filter, sharers, proc.id == sharers[0]
            return route
        until = mixed_history_end(layout, partition[1])
        if until is None or route.position < until:
            route.key_filter = KeyFilter(bucket_modulus(proc.id, place.p0, place.p), frozenset({proc.id}))
            route.filter_until = until
        return route
