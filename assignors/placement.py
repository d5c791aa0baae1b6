"""Placement of keys, partitions and processors (docs/design.md).

key -> processor is ``lh_bucket(h, p0, p)``: linear hashing of the key hash over the
job's processors, ``p0`` being the job's initial processor count and ``p`` the
current one.  It is defined on the hash, not on the partition index, so:

- adding partitions to an input topic never changes key -> processor (no state moves
  between processors): no state moves when partitions grow, whatever ``n0`` and ``p0`` are;
- adding processor ``p`` moves only the keys of one processor bucket (the split
  pointer ``p - B``) to the new processor (only one bucket splits).

Each partition is one residue class of hashes and each processor bucket is another,
so a (partition, processor) pair shares either nothing or exactly one residue class
modulo the lcm of the two moduli.  A partition either belongs wholly to one
processor (filter None) or is a *shared task*: several processors read it,
each keeping only the hashes its :class:`KeyFilter` accepts.

When is every partition whole?  With ``n >= p`` (partitions grow before processors, as
processor expansion requires) and ``n0 / p0`` a power of two (``p0 == n0`` as a job starts by
default, or ``n0 = p0 * 2**k``, or ``p0 = n0 * 2**k``): the partition
buckets then refine the processor buckets, and the processor of partition ``part`` is
``lh_bucket(part, p0, p)``, the literal "partition -> processor by linear
hashing".  If ``p0`` divides ``n0`` otherwise (e.g. ``n0 = 3 * p0``), partitions are
whole while ``p == p0`` (at any ``n``), but processor growth can create shared tasks
(``n0 = 3, p0 = 1``: at ``n = 3, p = 2`` partition 0, ``h % 3 == 0``, spans both
processors); if ``p0`` does not divide ``n0``, some partitions are shared even at
``p == p0``.  Consequence: key ->
processor is still unchanged by partition expansion (it never looks at partitions),
but a shared partition is fetched in full by each of its processors, which discard
the others' keys (read amplification, the cost key-range sharing accepts), and the
partition-index formula ``lh_bucket(part, p0, p)`` would then be wrong (it would move
keys between existing processors on partition expansion), which is why streamkit
routes by hash.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from assignors.linear_hashing import (
    _check_counts,
    bucket_modulus,
    key_sources,
    lh_base,
    lh_bucket,
    lh_bucket_batch,
)

__all__ = [
    "KeyFilter",
    "processor_for_hash",
    "processors_for_partition",
    "partitions_for_processor",
    "assign_partitions",
    "assign_processors_to_members",
    "processor_key_sources",
]

Assignment = dict[int, list[tuple[str, int, "KeyFilter | None"]]]


@dataclass(frozen=True, slots=True)
class KeyFilter:
    """The hashes ``h`` with ``h % modulus in residues``: a processor's share of a
    partition it does not own wholly (a shared task).

    Applied to records of one partition, so the residues are consistent with that
    partition's own class (the filter alone identifies the processor's keys there).
    """

    modulus: int
    residues: frozenset[int]

    def __post_init__(self) -> None:
        if self.modulus < 1:
            raise ValueError(f"modulus must be >= 1, got {self.modulus}")
        if not self.residues:
            raise ValueError("a KeyFilter needs at least one residue")
        if any(not 0 <= r < self.modulus for r in self.residues):
            raise ValueError(f"residues must be in range(0, {self.modulus})")

    def accepts(self, h: int) -> bool:
        """Whether the key hash ``h`` belongs to this filter."""
        return h % self.modulus in self.residues

    def accepts_batch(self, h: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.bool_]:
        """:meth:`accepts` of every hash in ``h`` (a boolean mask)."""
        h = np.asarray(h)
        r = h % h.dtype.type(self.modulus)
        mask: npt.NDArray[np.bool_]
        if len(self.residues) == 1:
            mask = r == next(iter(self.residues))
        else:
            mask = np.isin(r, np.fromiter(self.residues, dtype=r.dtype))
        return mask


def processor_for_hash(h: int, p0: int, p: int) -> int:
    """The processor owning key hash ``h``: ``lh_bucket(h, p0, p)``."""
    return lh_bucket(h, p0, p)


def _intersections(b: int, n0: int, n: int, other_n0: int, other_n: int) -> dict[int, tuple[int, int]]:
    """For bucket ``b`` of layout (n0, n): ``{other bucket: (lcm, residue)}`` for every
    bucket of layout (other_n0, other_n) sharing hashes with it.

    Enumerates the hashes of ``b`` modulo ``lcm(M_b, 2 * B_other)`` (one representative
    per class that the other layout can tell apart) and keeps, per other bucket, the
    single class ``h ≡ r (mod lcm(M_b, M_other))`` of their intersection.
    """
    m_b = bucket_modulus(b, n0, n)
    span = math.lcm(m_b, 2 * lh_base(other_n0, other_n))
    count = span // m_b
    first: dict[int, int] = {}  # other bucket -> first representative hash in it
    if count <= 64:  # the common case (n >= p, p0 == n0): 1 or 2; skip numpy overhead
        for r in range(b, span, m_b):
            first.setdefault(lh_bucket(r, other_n0, other_n), r)
    else:
        reps = b + m_b * np.arange(count, dtype=np.int64)
        uniq, idx = np.unique(lh_bucket_batch(reps, other_n0, other_n), return_index=True)
        first = {q: int(reps[i]) for q, i in zip(uniq.tolist(), idx.tolist())}
    result: dict[int, tuple[int, int]] = {}
    for q in sorted(first):
        modulus = math.lcm(m_b, bucket_modulus(q, other_n0, other_n))
        result[q] = (modulus, first[q] % modulus)
    return result


def processors_for_partition(partition: int, n0: int, n: int, p0: int, p: int) -> dict[int, KeyFilter | None]:
    """Which processors receive keys of ``partition`` (topic layout ``n0 -> n``, job
    ``p0 -> p``): ``{processor: None}`` when one processor owns the whole partition,
    else ``{processor: KeyFilter}`` with disjoint filters covering the partition.
    """
    _check_counts(n0, n)
    _check_counts(p0, p, "p")
    if not 0 <= partition < n:
        raise ValueError(f"partition {partition} out of range(0, {n})")
    shares = _intersections(partition, n0, n, p0, p)
    if len(shares) == 1:
        return {q: None for q in shares}
    return {q: KeyFilter(m, frozenset((r,))) for q, (m, r) in shares.items()}


def partitions_for_processor(proc: int, n0: int, n: int, p0: int, p: int) -> list[int]:
    """The partitions (layout ``n0 -> n``) holding keys of processor ``proc`` now:
    S1 of a processor bootstrap for one topic.  Same answer as scanning
    :func:`processors_for_partition` over all partitions, at the cost of one
    enumeration of the processor's residue classes."""
    _check_counts(p0, p, "p")
    _check_counts(n0, n)
    if not 0 <= proc < p:
        raise ValueError(f"processor {proc} out of range(0, {p})")
    return sorted(_intersections(proc, p0, p, n0, n))


def assign_partitions(topics: Mapping[str, tuple[int, int]], p0: int, p: int) -> Assignment:
    """``{processor: [(topic, partition, KeyFilter | None), ...]}`` for every processor in
    ``range(p)`` (possibly an empty list), topics being ``{name: (n0, n)}``.

    Lists are sorted by (topic, partition); every hash of every partition is accepted
    by exactly one processor's entry.
    """
    _check_counts(p0, p, "p")
    result: Assignment = {q: [] for q in range(p)}
    for topic in sorted(topics):
        n0, n = topics[topic]
        for part in range(n):
            for q, flt in processors_for_partition(part, n0, n, p0, p).items():
                result[q].append((topic, part, flt))
    return result


def processor_key_sources(
    proc: int,
    topics: Mapping[str, tuple[int, int]],
    p0: int,
    p: int,
    *,
    high_water: Mapping[str, int] | None = None,
) -> dict[str, set[int]]:
    """S2 for processor ``proc``: per topic, the partitions that may hold
    records of its keys, i.e. the partitions holding its keys now (S1) and all their
    ancestors (where those keys lived before the partitions were split).

    ``high_water`` ({topic: largest partition count ever}) adds the deleted partitions
    of shrunk topics whose keys now land in S1 (see :func:`key_sources`).
    """
    result: dict[str, set[int]] = {}
    for topic in sorted(topics):
        n0, n = topics[topic]
        hw = None if high_water is None else high_water.get(topic)
        sources: set[int] = set()
        for part in partitions_for_processor(proc, n0, n, p0, p):
            sources |= key_sources(part, n0, n, high_water=hw)
        result[topic] = sources
    return result


def assign_processors_to_members(
    members: Mapping[str, Sequence[int]], p: int, together: Sequence[Sequence[int]] = ()
) -> dict[str, list[int]]:
    """Host processors ``range(p)`` on consumer-group members, sticky and balanced.

    ``members`` maps each member id to the processor ids it hosted before (its
    user_data).  Result: every id in ``range(p)`` on exactly one member (when there is
    at least one member), counts differing by at most one, lists sorted.

    Stickiness: the members that get the larger quota (``p // k + 1``) are those that
    previously held the most valid ids (ties by member id); each member then keeps
    its previous ids up to its quota (lowest ids first), and the remaining ids go, in
    ascending order, to the members with room, in member-id order.  A previous
    assignment that is already valid and balanced is returned unchanged.  An id
    claimed by several members stays with the first of them in member-id order.
    Deterministic: depends only on the mapping's contents, not its order.

    ``together``: groups of ids that would rather share a member (the sharers of one
    partition, which a member then fetches once). Balance and stickiness come first;
    the remaining ids are handed out group by group, a group's free ids going first to
    a member that already hosts one of them, so that a member with room for several
    takes one group's whole.
    """
    if p < 0:
        raise ValueError(f"processor count must be >= 0, got {p}")
    names = sorted(members)
    if not names:
        return {}
    claimed: set[int] = set()
    previous: dict[str, list[int]] = {}
    for name in names:
        mine = sorted({q for q in members[name] if 0 <= q < p} - claimed)
        claimed.update(mine)
        previous[name] = mine
    base, extra = divmod(p, len(names))
    by_claim = sorted(names, key=lambda name: (-len(previous[name]), name))
    quota = {name: base + (1 if i < extra else 0) for i, name in enumerate(by_claim)}
    result: dict[str, list[int]] = {}
    taken: set[int] = set()
    for name in names:
        kept = previous[name][: quota[name]]
        result[name] = kept
        taken.update(kept)
    groups = [[q for q in group if 0 <= q < p] for group in together]
    order = [q for group in groups for q in group] + list(range(p))
    free = list(dict.fromkeys(q for q in order if q not in taken))
    group_of = {q: i for i, group in enumerate(groups) for q in group}
    for q in free:
        with_room = [name for name in names if len(result[name]) < quota[name]]
        near = [n for n in with_room if q in group_of and any(group_of.get(x) == group_of[q] for x in result[n])]
        result[(near or with_room)[0]].append(q)
    return {name: sorted(ids) for name, ids in result.items()}
