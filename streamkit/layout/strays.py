"""Strays: records a producer put where the topic's layout does not place them.

A streamkit producer places every key by linear hashing over the topic's active
partitions and stamps the record with the layout epoch it placed by. A plain Kafka
producer knows none of this: its default partitioner takes the key's murmur2 hash
modulo the *physical* partition count, so on a topic with reserved capacity, or one
that was ever expanded or shrunk, it writes keys into partitions nobody reads
(reserved ones), into partitions before their activation, and into active partitions
that do not own them. Such a record is a *stray*: applied where it lies it would be
lost (nobody reads the partition) or would split its key's state over two processors.

:class:`StrayRule` tells, for one partition, which records are strays. A record at
offset ``o`` of partition ``p`` is in place when ``p`` is the key's bucket under a
layout in force on ``p`` at ``o``: the layout before a change is in force up to the
change's seal offset on ``p``, the layout after it from its announce offset (both in
between, while producers switch). A keyless record is in place on a partition that
was writable at ``o``. Records stamped by streamkit's producer are not judged here
(their epoch is checked by ``stamps``); every record of a partition no layout reads
any more (mode None: reserved capacity, or drained and given up) is a stray.

The runtime forwards a stray through the layout-aware producer to where the current
layout places its key, with :data:`STRAY_HEADER` naming where it came from (sealed, so
that a record merely carrying the header is not taken for a copy), or sends
it to the dead letters (reason ``misplaced``), per the input topic's ``strays``
setting. A forwarded copy may be written twice when a worker dies between the send
and its checkpoint; the receiving processor drops the second copy by its origin
(:class:`SeenStrays`). After a layout change the second copy could land elsewhere: a
reader starting where a dead sweep forwarded looks for its copies first and does not
forward those strays again (``streamkit.runtime.copies``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from assignors.linear_hashing import bucket_modulus, lh_bucket
from assignors.murmur2 import key_hash_cached
from assignors.vectorized import key_hash_batch
from streamkit.layout.model import ChangeKind, TopicLayout

__all__ = [
    "STRAY_HEADER",
    "SeenStrays",
    "StrayRule",
    "SweepEnds",
    "activation",
    "altered_by",
    "in_place_until",
    "no_sweep_ends",
    "parse_origin",
    "plain_rule",
    "stray_rule",
    "sweep_end",
]

SweepEnds = Callable[[str, int], Mapping[int, int]]
"""Per (topic, partition): where a group's sweeps of it ended, by activation offset
(``streamkit.runtime.progress.ProgressLog.sweep_ends``)."""


def no_sweep_ends(topic: str, partition: int) -> Mapping[int, int]:
    return {}


STRAY_HEADER = "streamkit.stray.from"
"""On a forwarded stray: ``b"PARTITION:OFFSET:SEAL"`` of the record it copies (same topic;
the seal tells streamkit's copies from records that merely carry the header,
``streamkit.layout.seal``)."""


def parse_origin(value: bytes) -> tuple[int, int] | None:
    """(partition, offset) a :data:`STRAY_HEADER` value *claims*, or None if it is not one.
    Only ``OriginSeal.origin`` says whether streamkit wrote it."""
    try:
        partition, offset, *_ = value.split(b":")
        return int(partition), int(offset)
    except (ValueError, TypeError, AttributeError):
        return None


@dataclass(frozen=True)
class StrayRule:
    """Which records of one partition are strays (see the module docstring)."""

    partition: int
    n0: int
    starts: tuple[int, ...]
    """Offsets where the set of layouts in force on the partition changes (first: 0)."""
    actives: tuple[tuple[int, ...], ...]
    """Per segment: the active partition counts of the layouts in force there."""
    everything: bool = False
    """The partition is read by no layout now (mode None): every record is a stray."""

    moduli: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    """Per segment: for each count in force at which the partition exists, the modulus
    ``M`` of its keys there (``hash % M == partition``; ``bucket_modulus``)."""
    in_place: set[bytes] = field(default_factory=set, init=False, repr=False, compare=False)
    """Keys found in place in the last segment, where the records read now lie: a record
    of one of them is not hashed again (at most ``KNOWN_IN_PLACE`` keys, then forgotten)."""
    _unlearned: list[int] = field(default_factory=lambda: [0], init=False, repr=False, compare=False)
    """Keys still to pass before learning again: a partition whose keys filled ``in_place``
    has more keys than it can remember (a million), where a batch is almost never all
    known: learning them all would cost a set insertion per record for nothing."""

    def __post_init__(self) -> None:
        p, n0 = self.partition, self.n0
        moduli = tuple(tuple(sorted({bucket_modulus(p, n0, n) for n in a if p < n})) for a in self.actives)
        object.__setattr__(self, "moduli", moduli)

    def known_in_place(self, offset: int) -> set[bytes] | None:
        """The keys known in place at ``offset`` and beyond (None: not tracked there, the
        last segment does not start before ``offset``, or holds no key of the partition)."""
        if self.everything or offset < self.starts[-1] or len(self.moduli[-1]) != 1:
            return None
        return self.in_place

    def is_stray(self, offset: int, key_hash: int | None) -> bool:
        if self.everything:
            return True
        actives = self.actives[bisect.bisect_right(self.starts, offset) - 1]
        if key_hash is None:
            return all(self.partition >= n for n in actives)
        n0, p = self.n0, self.partition
        return all(lh_bucket(key_hash, n0, n) != p for n in actives)

    def strays_in(self, records: Sequence[Any]) -> list[Any]:
        """The strays among unstamped ``records`` of the partition (offset order; each
        with ``offset`` and ``key``): :meth:`is_stray` of each, one modulo per keyed
        record and no call in the usual case of one count in force."""
        if self.everything:
            return list(records)
        p, starts = self.partition, self.starts
        out: list[Any] = []
        i = 0
        while i < len(records):
            seg = bisect.bisect_right(starts, records[i].offset) - 1
            j = len(records)
            if seg + 1 < len(starts):
                j = bisect.bisect_left(records, starts[seg + 1], lo=i, key=_offset_of)
            run, ms = records[i:j], self.moduli[seg]
            if not ms:  # the partition exists under no layout in force here
                out += run
            elif len(ms) == 1:
                found = _outside_one(run, ms[0], p)
                out += found
                if seg == len(starts) - 1:
                    self._learn(run, found)
            else:
                hashes = _key_hashes(run)
                out += [r for r, h in zip(run, hashes, strict=True) if _outside(h, ms, p) and r.key is not None]
            i = j
        return out

    def _learn(self, run: Sequence[Any], strays: list[Any]) -> None:
        unlearned = self._unlearned
        if unlearned[0] > 0:
            unlearned[0] -= len(run)
            return
        known = self.in_place
        if len(known) > KNOWN_IN_PLACE:
            known.clear()
            unlearned[0] = LEARN_AGAIN_AFTER
            return
        if strays:
            out = {id(r) for r in strays}
            known.update(rk for r in run if (rk := r.key) is not None and id(r) not in out)
        else:
            known.update(rk for r in run if (rk := r.key) is not None)


KNOWN_IN_PLACE = 1 << 16
LEARN_AGAIN_AFTER = 8 * KNOWN_IN_PLACE
"""Records read without learning their keys after ``in_place`` filled up: it learns one
stretch in nine, and a partition whose keys come back often still gets known."""

BATCH_HASH_FROM = 64
"""Records from which a run's keys are hashed at once (numpy) rather than one by one."""


def _key_hashes(run: Sequence[Any]) -> list[int]:
    """The murmur2 hash of each record's key (any number for a keyless one). A long run is
    a plain producer's batch of keys not seen lately (more keys than a partition remembers
    in place): hashed at once, about 0.15 µs a key, where one missing from the scalar
    cache costs 1.2 µs in Python."""
    if len(run) >= BATCH_HASH_FROM:
        return key_hash_batch([r.key for r in run]).tolist()
    return [key_hash_cached(rk) if (rk := r.key) is not None else 0 for r in run]


def _outside_one(run: Sequence[Any], modulus: int, partition: int) -> list[Any]:
    """The keyed records of ``run`` whose hash modulo ``modulus`` is not ``partition``: at
    a million keys the check every plain producer's record takes, so a long run is checked
    in numpy (only the strays, usually none, come back to Python)."""
    if len(run) < BATCH_HASH_FROM:
        return [r for r in run if (rk := r.key) is not None and key_hash_cached(rk) % modulus != partition]
    hashes = key_hash_batch([r.key for r in run])
    return [r for i in np.flatnonzero(hashes % modulus != partition).tolist() if (r := run[i]).key is not None]


def _offset_of(record: Any) -> int:
    return int(record.offset)


def _outside(h: int, moduli: tuple[int, ...], partition: int) -> bool:
    return all(h % m != partition for m in moduli)


def activation(layout: TopicLayout, partition: int) -> int | None:
    """The announce offset of the expansion that made ``partition`` active last, if it
    had been reserved or given up (mode None) before: where its sweep was to end."""
    for s in reversed(layout.seals):
        if s.kind == ChangeKind.EXPAND and partition in s.partitions:
            return s.announce_offset(partition)
    return None


def sweep_end(
    layout: TopicLayout | None, partition: int, ends: Mapping[int, int], last_commit_swept: bool, start: int
) -> tuple[int, int] | None:
    """``(activation offset, end)`` for a processor about to apply ``partition`` in place
    from ``start``, when it is the first to since an expansion activated the partition
    (no end recorded for that activation, and the group's position was last moved by a
    sweep, or never): the sweep ended where the group got, or at the activation. None
    otherwise (the end is known, or the records there were applied in place)."""
    if layout is None:
        return None
    activated = activation(layout, partition)
    if activated is None or activated in ends or not last_commit_swept:
        return None
    return activated, max(activated, start)


def stray_rule(
    layout: TopicLayout | None, partition: int, *, swept: bool = False, sweep_ends: Mapping[int, int] | None = None
) -> StrayRule | None:
    """The rule for ``partition`` under ``layout`` (None: a plain topic, not checked).

    Every topic with a layout has one, even one never changed and without reserved
    capacity, where Kafka's default partitioner (murmur2 modulo the partition count)
    places keys as the layout does: librdkafka's (CRC32, confluent-kafka's and so
    quixstreams' default) does not, and a key it put elsewhere would be applied by a
    processor that does not own it (its state split over two when another producer
    writes it too, or lost from view when processors are scaled).

    ``swept``: the partition is read only to forward what lies in it (mode None).
    ``sweep_ends``: per activation offset of the partition (:func:`activation`), where the
    group's sweep of it actually ended: a sweep that had not yet learnt of the expansion
    forwarded records beyond its announce offset, so the layout after it is in force on
    the partition from there (below, every unstamped record is a stray)."""
    if layout is None:
        return None
    if swept:
        return StrayRule(partition, layout.n0, (0,), ((),), everything=True)
    changes = [s for s in layout.seals if s.kind in (ChangeKind.EXPAND, ChangeKind.SHRINK)]
    # in force on the partition: (from offset, until offset or None, active count)
    spans: list[tuple[int, int | None, int]] = []
    begin = 0
    active = changes[0].old_active if changes else layout.active
    for s in changes:
        until = s.seal_offset(partition) if s.sealed else None
        spans.append((begin, until, active))
        announced = s.announce_offset(partition)
        begin = 0 if announced is None else announced  # a partition created by it starts empty
        if sweep_ends and announced is not None and s.kind == ChangeKind.EXPAND and partition in s.partitions:
            begin = max(begin, sweep_ends.get(announced, begin))
        active = s.new_active
    spans.append((begin, None, active))
    bounds = sorted({0, *(b for b, _, _ in spans), *(u for _, u, _ in spans if u is not None)})
    actives = tuple(
        tuple(sorted({n for b, u, n in spans if b <= start and (u is None or start < u)})) for start in bounds
    )
    return StrayRule(partition, layout.n0, tuple(bounds), actives)


def altered_by(layout: TopicLayout) -> frozenset[int]:
    """The partitions whose keys the layout's announced, unsealed expansion or shrink
    changes (a split parent and its child, a merge target and the partition merged into
    it): their stray rules after the seal differ from those before it."""
    pend = layout.pending
    if pend is None or pend.kind not in (ChangeKind.EXPAND, ChangeKind.SHRINK):
        return frozenset()
    n0 = layout.n0

    def keys(p: int, n: int) -> int | None:
        return bucket_modulus(p, n0, n) if p < n else None

    top = max(pend.old_active, pend.new_active)
    return frozenset(p for p in range(top) if keys(p, pend.old_active) != keys(p, pend.new_active))


def plain_rule(partition: int, partitions: int) -> StrayRule:
    """The rule for a partition of a plain topic (no layout) of ``partitions`` partitions:
    keys belong where Kafka's default partitioner (murmur2) puts them, which is linear
    hashing at a count never changed. A producer placing keys otherwise (librdkafka's
    CRC32) would have them applied by a processor that does not own them: in a shared
    partition, by none (every sharer's key range refuses them)."""
    return StrayRule(partition, partitions, (0,), ((partitions,),))


def in_place_until(layout: TopicLayout | None, partition: int, start: int, end: int) -> int:
    """How far a processor's catch-up of its keys in ``partition`` may read from
    ``start`` towards ``end``: up to the first span at or after ``start`` in which no
    layout in force read the partition (it was reserved, or drained and given up, until
    an expansion activated it). Every record of such a span is a stray, its sweep's to
    forward; a catch-up, which reads only its own keys, would pass over them as if they
    were forwarded. What lies beyond the span is the activated partition's, read by its
    owner."""
    rule = stray_rule(layout, partition)
    if rule is None:
        return end
    starts = rule.starts
    seg = max(0, bisect.bisect_right(starts, start) - 1)
    while seg < len(starts) and starts[seg] < end:
        if not rule.moduli[seg]:
            return max(start, starts[seg])
        seg += 1
    return end


@dataclass
class SeenStrays:
    """Per (origin partition, partition it was forwarded to): the highest origin offset a
    processor applied. A forwarder sends one origin partition's strays in offset order,
    so a copy at or below it was applied already (written twice by a forwarder that
    died before its checkpoint, or by two forwarders across a handover).

    A copy is marked when admission lets it through (``highest``), but applied only later
    when the processor's time-ordered merge holds it (or a key-concurrent handler queues
    it): a checkpoint records the table as of its stable offsets (:meth:`table_at`), never
    a copy beyond them. Else a copy held when the processor is given up would be read
    again from the checkpoint and dropped as a second copy of itself: lost."""

    highest: dict[str, int] = field(default_factory=dict)
    """What admission let through (a copy at or below is dropped)."""
    learned: list[tuple[str, int, int, str, int]] = field(default_factory=list, init=False)
    """(topic, partition, offset of the copy, key, origin offset) of the copies let through
    since the last checkpoint (:meth:`compact`)."""
    saved: dict[str, int] = field(init=False)
    """The table as of the last checkpoint (``highest`` as loaded from it)."""

    def __post_init__(self) -> None:
        self.saved = dict(self.highest)

    @staticmethod
    def _key(topic: str, origin: int, partition: int) -> str:
        return f"{topic}:{origin}:{partition}"

    def first_time(self, topic: str, partition: int, origin: tuple[int, int], at: int) -> bool:
        """Record that the copy of ``origin`` arrived on ``partition`` at offset ``at``;
        False if it did before."""
        key = self._key(topic, origin[0], partition)
        if origin[1] <= self.highest.get(key, -1):
            return False
        self.highest[key] = origin[1]
        self.learned.append((topic, partition, at, key, origin[1]))
        return True

    def table_at(
        self, positions: Mapping[tuple[str, int], int], ranges: Mapping[tuple[str, int], Sequence[tuple[int, int]]]
    ) -> dict[str, int]:
        """The table as of a checkpoint: the copies below its stable offsets, or in its IC
        ranges (applied beyond them by key-concurrent handlers; read again, those offsets
        are skipped before this table is asked)."""
        table = dict(self.saved)
        for topic, partition, at, key, origin in self.learned:
            if _applied(at, positions.get((topic, partition), 0), ranges.get((topic, partition), ())):
                table[key] = max(origin, table.get(key, -1))
        return table

    def compact(
        self, positions: Mapping[tuple[str, int], int], ranges: Mapping[tuple[str, int], Sequence[tuple[int, int]]]
    ) -> None:
        """A checkpoint of ``positions`` and IC ``ranges`` is in the store: the copies it
        counts join ``saved``, the others stay learned."""
        held = []
        for entry in self.learned:
            topic, partition, at, key, origin = entry
            if _applied(at, positions.get((topic, partition), 0), ranges.get((topic, partition), ())):
                self.saved[key] = max(origin, self.saved.get(key, -1))
            else:
                held.append(entry)
        self.learned = held


def _applied(offset: int, position: int, ranges: Sequence[tuple[int, int]]) -> bool:
    return offset < position or any(start <= offset <= end for start, end in ranges)
