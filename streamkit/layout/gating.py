"""Ordered delivery across layout changes: PURE logic the processor loop calls.

KIP-253's ordered delivery realised with seals instead of leader epochs and with
the group's committed offsets instead of ConsumerGroupPositionRequest.

Constraints
-----------
Every expansion and shrink in a layout's history yields *constraints*
``(partition p, from_offset X, blocker q, need Y)``: records of ``p`` at offsets
``>= X`` may be delivered only once the group's position (committed offset = next
offset to consume) of ``q`` is ``>= Y``.

- Expansion at epoch ``e`` (``expansion_blockers``: new partition ``c`` <- ``q``):
  ``X = announce_offsets[c]`` (the start of ``c``'s incarnation: all of it is gated),
  ``Y = seal_offsets[q]``: the group must have passed every old-layout record of
  ``q``; only then may ``c``'s first record, whose key may have lived in ``q``, go out.
- Shrink at epoch ``e`` (``deletion_blockers``: survivor ``s`` <- drained ``d``):
  ``X = announce_offsets[s]`` (no record of a moved key can be below it: producers
  switch only after the announcement), ``Y = seal_offsets[d]`` (the end of ``d``'s
  old-layout records: ``d`` is ReadOnly, nothing correct is written there after it).
  Records of ``s`` below ``X`` flow freely; beyond it ``s`` waits for every ``d``.
- While a change is announced but not sealed, ``Y`` is unknown (None): the gated
  region is blocked.
- Satisfaction is transitive: a constraint holds when the group's position of ``q``
  is ``>= Y`` AND every constraint on ``q`` from an older epoch holds.  A key that
  moved ``a -> q`` and later ``q -> p`` may have no record in ``q`` at all, so
  ``q``'s position alone says nothing about ``a`` (found by the randomized history
  test: ``tests/layout/test_gating.py``).
- A blocker given up after the constraint (``finish_drain``, ReadOnly -> None) counts
  as passed (``need = 0``): its remaining records are not delivered, so nothing waits
  for them.  The constraint itself stays, so chains through the given-up partition
  (keys that moved ``a -> d -> s`` with no record in ``d``) still wait for ``a``.  A
  partition re-created later starts a new incarnation at its announce offset.
- ``ordered_delivery=False`` on the layout: no constraints (KIP-253's per-topic
  switch); None partitions are still skipped and incarnation starts still apply.

Positions are *group* positions: the committed offsets of the consumer group
(readable by every member), so a member gated on a partition another member
consumes waits for that member's commit.  The member owning a blocker must therefore
commit promptly after passing ``Y``; :class:`GateTracker` says when
(``fire_revoked``), and says when a gated partition opens (``fire_assigned``), which
is when KIP-253's ``onPartitionKeyMaybeRevoked`` / ``onPartitionKeyAssigned`` run.

Records are classified by their epoch stamps in ``streamkit.layout.stamps``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from assignors.linear_hashing import deletion_blockers, expansion_blockers
from streamkit.layout.model import ChangeKind, PartitionMode, TopicLayout

__all__ = [
    "Constraint",
    "GateState",
    "GateTracker",
    "GateUpdate",
    "PartitionGate",
    "compute_gate",
    "constraints",
    "gate_limits",
    "satisfied",
]


@dataclass(frozen=True)
class Constraint:
    """Records of ``partition`` at offsets ``>= from_offset`` wait until the group's
    position of ``blocker`` is ``>= need`` (None: not known yet, blocked)."""

    partition: int
    from_offset: int
    blocker: int
    need: int | None
    epoch: int
    kind: ChangeKind

    @property
    def id(self) -> tuple[int, int, int]:
        return (self.epoch, self.partition, self.blocker)

    def blocker_passed(self, group_positions: Mapping[int, int]) -> bool:
        """The group's position of the blocker reached ``need`` (not the whole condition:
        see :func:`satisfied`)."""
        return self.need is not None and group_positions.get(self.blocker, 0) >= self.need


class _Eval:
    """Transitive satisfaction of constraints, memoised for one set of positions.

    A constraint ``(p, X, q, Y, epoch e)`` is satisfied when the group's position of
    ``q`` is ``>= Y`` AND every constraint on ``q`` from an earlier epoch is
    satisfied.  The second half matters when ``q``'s gated region is empty: a key
    that moved ``a -> q`` at epoch e1 and ``q -> p`` at e2 may have no record in
    ``q`` at all, so ``q``'s position says nothing about ``a``; ``p`` must still wait
    for ``a``.  Recursion follows strictly older epochs, so it terminates.
    """

    def __init__(self, cons: Iterable[Constraint], group_positions: Mapping[int, int]) -> None:
        self.by_part: dict[int, list[Constraint]] = {}
        for c in cons:
            self.by_part.setdefault(c.partition, []).append(c)
        self.pos = group_positions
        self.memo: dict[tuple[int, int, int], bool] = {}
        self.watch: set[int] = set()

    def ok(self, c: Constraint) -> bool:
        key = c.id
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        res = c.blocker_passed(self.pos)
        if not res:
            self.watch.add(c.blocker)
        if res:
            for c2 in self.by_part.get(c.blocker, ()):
                if c2.epoch < c.epoch and not self.ok(c2):
                    res = False
                    break
        self.memo[key] = res
        return res


def satisfied(layout: TopicLayout, constraint: Constraint, group_positions: Mapping[int, int]) -> bool:
    """Whether ``constraint`` of ``layout`` is satisfied (transitively; see ``_Eval``)."""
    return _Eval(constraints(layout), group_positions).ok(constraint)


@functools.lru_cache(maxsize=512)
def constraints(layout: TopicLayout, history: bool = False) -> tuple[Constraint, ...]:
    """The live constraints of ``layout`` (see the module docstring).

    ``history``: for a reader of the whole history (a processor rebuilding its state),
    a partition given up after a drain still blocks until it is read to its seal."""
    if not layout.ordered_delivery:
        return ()
    n0 = layout.n0
    finishes = [(s.epoch, set(s.partitions)) for s in layout.seals if s.kind == ChangeKind.FINISH]

    def given_up(epoch: int, p: int) -> bool:
        return not history and any(fe > epoch and p in fp for fe, fp in finishes)

    out: list[Constraint] = []
    for s in layout.seals:
        if s.kind == ChangeKind.EXPAND:
            for c, q in sorted(expansion_blockers(n0, s.old_active, s.new_active).items()):
                need = (s.seal_offset(q) or 0) if s.sealed else None
                if need is not None and given_up(s.epoch, q):
                    need = 0
                out.append(Constraint(c, s.announce_offset(c) or 0, q, need, s.epoch, s.kind))
        elif s.kind == ChangeKind.SHRINK:
            for sv, ds in sorted(deletion_blockers(n0, s.old_active, s.new_active).items()):
                for d in sorted(ds):
                    need = (s.seal_offset(d) or 0) if s.sealed else None
                    if need is not None and given_up(s.epoch, d):
                        need = 0
                    out.append(Constraint(sv, s.announce_offset(sv) or 0, d, need, s.epoch, s.kind))
    return tuple(out)


@dataclass(frozen=True)
class PartitionGate:
    """What one assigned partition may deliver now.

    ``start``: seek to ``max(position, start)`` (older records are leftovers of a
    previous incarnation).  ``limit``: deliver only offsets ``< limit``; None = no
    limit.  ``skip``: the partition is None-mode: do not consume it at all.
    ``waiting_on``: ``(blocker, need)`` of the unsatisfied constraints at ``limit``.
    """

    partition: int
    start: int
    limit: int | None
    skip: bool = False
    waiting_on: tuple[tuple[int, int | None], ...] = ()

    def deliverable(self, offset: int) -> bool:
        return not self.skip and offset >= self.start and (self.limit is None or offset < self.limit)


@dataclass(frozen=True)
class GateState:
    """The gates of one member's assignment of one topic, at one layout version."""

    topic: str
    epoch: int
    gates: Mapping[int, PartitionGate]
    watch: frozenset[int] = frozenset()
    """Blockers whose group position (committed offset) this member needs: poll them."""
    revoke_points: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    """Assigned blockers -> seal offsets other partitions wait for (commit past them)."""

    @property
    def limits(self) -> dict[int, int | None]:
        return {p: (g.start if g.skip else g.limit) for p, g in self.gates.items()}

    @property
    def starts(self) -> dict[int, int]:
        return {p: g.start for p, g in self.gates.items()}

    @property
    def skip(self) -> frozenset[int]:
        return frozenset(p for p, g in self.gates.items() if g.skip)

    @property
    def blocked(self) -> frozenset[int]:
        """Assigned partitions that cannot deliver anything beyond their limit now."""
        return frozenset(p for p, g in self.gates.items() if g.limit is not None and not g.skip)


def compute_gate(
    layout: TopicLayout, assigned: Iterable[int], group_positions: Mapping[int, int], *, history: bool = False
) -> GateState:
    """Gate every partition in ``assigned`` given the group's committed positions.

    ``history``: gates for a reader of the whole history (a processor rebuilding its
    state from every partition that ever held its keys): every partition is read from
    offset 0, earlier incarnations and given-up partitions included, and given-up
    partitions still block until read to their seals."""
    cons = constraints(layout, history)
    ev = _Eval(cons, group_positions)
    assigned = sorted(set(assigned))
    mine = set(assigned)
    gates: dict[int, PartitionGate] = {}
    revoke: dict[int, set[int]] = {}
    for c in cons:
        if c.blocker in mine and c.need is not None and not c.blocker_passed(group_positions):
            revoke.setdefault(c.blocker, set()).add(c.need)
    for p in assigned:
        start = 0 if history else layout.base_offset(p)
        if layout.mode(p) == PartitionMode.NONE and not history:
            gates[p] = PartitionGate(p, start, start, skip=True)
            continue
        open_ = [c for c in ev.by_part.get(p, ()) if not ev.ok(c)]
        if not open_:
            gates[p] = PartitionGate(p, start, None)
            continue
        limit = max(start, min(c.from_offset for c in open_))
        waiting = tuple(sorted({(c.blocker, c.need) for c in open_ if c.from_offset <= limit}, key=repr))
        gates[p] = PartitionGate(p, start, limit, waiting_on=waiting)
    watch = ev.watch
    return GateState(
        topic=layout.topic,
        epoch=layout.epoch,
        gates=gates,
        watch=frozenset(watch),
        revoke_points={q: tuple(sorted(v)) for q, v in revoke.items()},
    )


def gate_limits(
    layout: TopicLayout, assigned: Iterable[int], group_positions: Mapping[int, int]
) -> dict[int, int | None]:
    """``{partition: limit}``: deliver offsets ``< limit`` (None: no limit).

    None-mode partitions get ``limit == start`` (nothing); see :func:`compute_gate`
    for starts, skips and what each partition waits on.
    """
    return compute_gate(layout, assigned, group_positions).limits


@dataclass(frozen=True)
class GateUpdate:
    state: GateState
    fire_revoked: tuple[int, ...]
    """Run on_keys_maybe_revoked(topic, these) now, THEN commit their positions."""
    fire_assigned: tuple[int, ...]
    """Run on_keys_assigned(topic, these) now, BEFORE delivering beyond their old limit."""


class GateTracker:
    """Remembers which key callbacks fired, per topic, for one member.

    Call :meth:`update` after every layout change, rebalance, commit of the group
    (fresh committed offsets of ``state.watch``) and whenever a local position passes
    a ``revoke_point``.  ``local_positions``: this member's own next offsets.
    """

    def __init__(self) -> None:
        self._fired: set[tuple[str, str, tuple[int, int, int]]] = set()

    def reset(self) -> None:
        self._fired.clear()

    def update(
        self,
        layout: TopicLayout,
        assigned: Iterable[int],
        group_positions: Mapping[int, int],
        local_positions: Mapping[int, int] | None = None,
        *,
        history: bool = False,
    ) -> GateUpdate:
        assigned = set(assigned)
        local = local_positions or {}
        state = compute_gate(layout, assigned, group_positions, history=history)
        revoked: set[int] = set()
        opened: set[int] = set()
        t = layout.topic
        ev = _Eval(constraints(layout, history), group_positions)
        for c in constraints(layout, history):
            if ev.ok(c):
                if c.partition in assigned:
                    key = (t, "a", c.id)
                    g = state.gates.get(c.partition)
                    if key in self._fired or g is None or g.skip:
                        continue
                    if g.limit is not None and g.limit <= c.from_offset:
                        continue  # another constraint still holds this region
                    self._fired.add(key)
                    pos = local.get(c.partition)
                    if pos is None or pos <= c.from_offset:
                        opened.add(c.partition)
            elif c.blocker in assigned and c.need is not None and not c.blocker_passed(group_positions):
                key = (t, "r", c.id)
                if key not in self._fired and local.get(c.blocker, -1) >= c.need:
                    self._fired.add(key)
                    revoked.add(c.blocker)
        return GateUpdate(state, tuple(sorted(revoked)), tuple(sorted(opened)))
