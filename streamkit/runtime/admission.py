"""Admission: which fetched records of an assigned partition may be applied now.

Per partition batch, in this order:

1. Records below the processor's position were applied already (a re-fetch): dropped.
2. Holes: records must follow each other without a gap from the position. The
   reference broker sometimes leaves batches out of a fetch answer while producers
   write the partition; asked again, they are there. The answer is cut before the
   hole and the consumer sent back to it; a hole still there after
   ``HOLE_CONFIRM_FETCHES`` fetches over ``HOLE_CONFIRM_SECONDS`` is real (compaction,
   transaction markers, retention) and read past, with a warning.
3. The gate: after a layout change a partition may deliver only offsets below its
   limit until the partitions its keys came from are consumed to their seals
   (``streamkit.layout.gating``). Records at or beyond the limit wait: the consumer
   is sent back to the limit and paused there.
4. Epoch stamps: a record stamped with a newer layout epoch than ours means our layout
   is stale: stop before it (the member re-reads the layout and gates again). One
   stamped older and lying beyond a later seal is a late record of a fenced producer:
   reported as an ordering violation, never applied silently.
5. Records inside the IC ranges of the processor's last checkpoint were applied before
   a restart (key-level concurrency finishes records out of offset order): skipped.
6. Strays (``streamkit.layout.strays``): unstamped records lying where the layout does
   not place their keys, and every record of a swept partition (mode None), are taken
   out to be forwarded or dead-lettered; a second copy of a forwarded stray is dropped.
   A stray's key is in no sharer's key range: the sharer taking keyless records takes it.
7. Records below the route's rebuild point were handled by the group before this
   processor got the partition: they are applied without output (strays among them
   were forwarded then: dropped).

3, 4 and 6 cost nothing when the topic has no pending change and records carry the
current epoch (6 also nothing on a topic a plain producer places like the layout). On
a plain producer's records whose keys are known in place, 4 and 6 share one pass.
Admission touches the consumer only through pause, resume and seek, so it is tested
against an in-memory consumer (``tests/runtime/test_admission.py``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import TopicPartition

from assignors.murmur2 import key_hash_cached
from assignors.placement import KeyFilter
from streamkit.exactly_once.markers import is_marker
from streamkit.kafkaio import HOLE_CONFIRM_FETCHES, HOLE_CONFIRM_SECONDS
from streamkit.layout.gating import GateTracker, PartitionGate
from streamkit.layout.model import PartitionMode, TopicLayout
from streamkit.layout.seal import OriginSeal
from streamkit.layout.strays import (
    SweepEnds,
    altered_by,
    no_sweep_ends,
    stray_rule,
)
from streamkit.ops.metrics import Durations
from streamkit.runtime.adoption import holding
from streamkit.runtime.epoch_check import EpochCheck
from streamkit.runtime.icranges import skip_applied
from streamkit.runtime.routes import Route, epoch_stamp
from streamkit.runtime.stray_check import StrayCheck, plain_and_in_place

log = logging.getLogger(__name__)


class ConsumerControl(Protocol):
    """The part of a consumer admission drives."""

    def pause(self, *partitions: TopicPartition) -> None: ...
    def resume(self, *partitions: TopicPartition) -> None: ...
    def seek(self, partition: TopicPartition, offset: int) -> None: ...


@dataclass
class Admitted:
    """What one partition batch may apply, and where the partition goes on from."""

    rebuild: list[Any]
    """Records the group handled before: apply without output."""
    deliver: list[Any]
    """Records to apply with output."""
    late: list[tuple[Any, dict[str, Any]]]
    """Late or misplaced records and their violation reports: dead letters."""
    strays: list[Any]
    """Records placed outside the layout by a plain producer: forward or dead-letter."""
    next_position: int
    consumed: int
    """Records taken off the answer (applied, reported or skipped as late)."""
    rejected: list[tuple[Any, str, str]] = field(default_factory=list)
    """Records that cannot be applied, as (record, reason, why): dead letters. Stamped with
    a layout epoch the registry never reached (``unknown-epoch``), or whose time the
    topic's ``timestamp=`` could not read (``timestamp``, ``streamkit.runtime.restamp``)."""


@dataclass
class GateEvents:
    """Key callbacks a re-gate calls for."""

    revoked: set[TopicPartition] = field(default_factory=set)
    """Keys of these partitions may move away: flush their state, then commit at once
    (other members wait for the commit)."""
    assigned: set[TopicPartition] = field(default_factory=set)
    """Keys of these partitions are now ours: load their state before delivering."""


class Admission:
    """The routes of one member's assigned partitions and what each may deliver.

    A partition has one route per hosted processor that reads it: one for a whole
    partition, several for a shared task (each with its key filter and its own position).
    The partition is fetched once, from the lowest of its routes' positions, and every
    route admits the records of the answer on its own (a route ahead drops what it
    applied already)."""

    def __init__(
        self,
        consumer: ConsumerControl,
        *,
        group: str,
        name: str,
        seal: OriginSeal,
        sweep_ends: SweepEnds | None = None,
    ) -> None:
        self.consumer = consumer
        self.stray_check = StrayCheck(seal, name)
        """Step 6: strays, and second copies of forwarded ones."""
        self.epoch_check = EpochCheck(seal, group)
        """Steps 3 and 4: gates and epoch stamps."""
        self.sweep_ends: SweepEnds = sweep_ends or no_sweep_ends
        """Where the group's sweeps of activated partitions ended (the stray rule's)."""
        self.group = group
        self.name = name
        self.routes: dict[TopicPartition, list[Route]] = {}
        self.trackers: dict[str, GateTracker] = {}
        self.gated = False
        """Some partition is held by its gate: re-gate often (the group's positions move)."""
        self.holes_refetched = 0
        self.holes_read_past = 0
        self.amended = 0
        """Records skipped because a checkpoint's IC ranges say they were applied."""
        self.gate_closed_at: dict[TopicPartition, float] = {}
        self.gate_waits: list[tuple[str, int, float]] = []
        self.gate_wait_seconds = Durations()
        """The same waits as a histogram (the worker's metrics)."""
        """(topic, partition, seconds gated) of every gate that opened."""

    @property
    def unknown_epochs(self) -> dict[str, dict[int, float]]:
        return self.epoch_check.unknown_epochs

    @property
    def copies_skipped_by(self) -> Counter[TopicPartition]:
        """Copies for compaction skipped, per partition (status, metrics)."""
        return self.epoch_check.copies_skipped_by

    @property
    def duplicate_strays_by(self) -> Counter[TopicPartition]:
        """Second copies of forwarded strays dropped and strays not forwarded again, per
        partition (status, metrics)."""
        return self.stray_check.duplicate_strays_by

    def add(self, tp: TopicPartition, route: Route) -> None:
        self.routes.setdefault(tp, []).append(route)

    def remove(self, routes: list[Route]) -> None:
        """Drop these routes (a partition without any left is no longer routed)."""
        gone = {id(r) for r in routes}
        for tp in list(self.routes):
            self.routes[tp] = [r for r in self.routes[tp] if id(r) not in gone]
            if not self.routes[tp]:
                del self.routes[tp]

    def fetch_position(self, tp: TopicPartition) -> int:
        """Where the consumer reads ``tp`` from: the lowest position of its routes."""
        return min(r.position for r in self.routes[tp])

    def clear(self) -> None:
        self.routes.clear()
        for tracker in self.trackers.values():
            tracker.reset()

    def __iter__(self) -> Iterator[tuple[TopicPartition, Route]]:
        return ((tp, route) for tp, routes in self.routes.items() for route in routes)

    # -- per batch ----------------------------------------------------------------------
    def admit(self, tp: TopicPartition, fetched: list[Any]) -> list[tuple[Route, Admitted]]:
        """Steps 1-6 of the module docstring for one partition's records, per route
        (none: nothing to do, e.g. fetched before a rebalance took the partition away)."""
        if not fetched:
            return []
        out = []
        for route in self.routes.get(tp, ()):
            admitted = self._admit(tp, route, fetched)
            if admitted is not None:
                out.append((route, admitted))
        return out

    def _admit(self, tp: TopicPartition, route: Route, fetched: list[Any]) -> Admitted | None:
        pos = route.position
        records = fetched
        if records[0].offset < pos:
            records = [r for r in records if r.offset >= pos]
            if not records:
                return None
        if records[0].offset != pos or records[-1].offset - pos != len(records) - 1:
            records = self.cut_at_hole(tp, route, pos, records)
            if not records:
                return None
        checked = records
        rule = route.strays
        quiet = rule is not None and plain_and_in_place(rule, records)  # steps 4 and 6 in one pass
        records, stop_at, late, rejected = self.epoch_check.gate_and_check(tp, route, records, epochs=not quiet)
        ahead = route.proc.ahead.get(route.position_key)
        if ahead and records:  # gap amending: applied before a restart, beyond the stable offset
            keep, amended = skip_applied([r.offset for r in records], ahead)
            if amended:  # (exactly-once markers are read again: a reader's table is as of the stable offset)
                kept = set(keep)
                records = [r for i, r in enumerate(records) if i in kept or is_marker(r)]
                self.amended += amended
                log.info("%s: %s[%d]: skipped %d records applied before a restart (IC ranges of the last checkpoint)",
                         self.name, tp.topic, tp.partition, amended)  # fmt: skip
        strays: list[Any] = []
        if rule is not None and records and not quiet:
            records, strays = self.stray_check.take(tp, route, records)
            if strays and route.key_filter is not None and not route.null_keys:
                strays = []  # in no sharer's key range: the sharer taking keyless records takes them
        until = route.filter_until
        if route.key_filter is not None and records and (until is None or records[0].offset < until):
            # a shared task, or a partition's history from before a split: this processor's keys only
            records = _keys_of(route.key_filter, route.null_keys, records, until)
        if late and route.key_filter is not None and (until is None or late[0][0].offset < until):
            # each sharer reports the late records of its own keys only (all of a batch may be late)
            kept = {id(r) for r in _keys_of(route.key_filter, route.null_keys, [r for r, _ in late], until)}
            late = [(r, report) for r, report in late if id(r) in kept]
        if rejected and route.key_filter is not None and (until is None or rejected[0][0].offset < until):
            # each sharer reports the records of its own keys only
            kept = {id(r) for r in _keys_of(route.key_filter, route.null_keys, [r[0] for r in rejected], until)}
            rejected = [r for r in rejected if id(r[0]) in kept]
        if late and late[0][0].offset < route.rebuild_until:  # reported when first handled
            late = [(r, report) for r, report in late if r.offset >= route.rebuild_until]
        if rejected and rejected[0][0].offset < route.rebuild_until:
            rejected = [r for r in rejected if r[0].offset >= route.rebuild_until]
        if strays and strays[0].offset < route.rebuild_until:  # forwarded when first handled
            strays = [r for r in strays if r.offset >= route.rebuild_until]
        strays = self.stray_check.not_forwarded_before(tp, route, strays)
        rebuild: list[Any] = []
        if records and records[0].offset < route.rebuild_until:
            rebuild = [r for r in records if r.offset < route.rebuild_until]
            records = records[len(rebuild) :]
        next_pos = stop_at if stop_at is not None else checked[-1].offset + 1
        if stop_at is not None:
            self.consumer.seek(tp, stop_at)
            if route.limit is not None and stop_at >= route.limit:
                self.consumer.pause(tp)
                self.gated = True
        return Admitted(rebuild, records, late, strays, next_pos, len(checked), rejected)

    def take_stale_epochs(self) -> dict[str, int]:
        """Per topic, the newest layout epoch records named beyond ours (then forgotten)."""
        stale: dict[str, int] = {}
        for tp, route in self:
            if route.stale_epoch is not None:
                stale[tp.topic] = max(stale.get(tp.topic, 0), route.stale_epoch)
                route.stale_epoch = None
        return stale

    def cut_at_hole(self, tp: TopicPartition, route: Route, pos: int, records: list[Any]) -> list[Any]:
        """The records before the first hole in their offsets, seeking back to ask for it
        again. A hole is read past only once it was asked for ``HOLE_CONFIRM_FETCHES``
        times over at least ``HOLE_CONFIRM_SECONDS``, with one warning line: a batch the
        broker has not written yet must never be taken for a real hole."""
        expected = pos
        for i, r in enumerate(records):
            if r.offset != expected:
                now = time.monotonic()
                seen = route.hole
                if seen is None or seen[:2] != (expected, r.offset):
                    route.hole = seen = (expected, r.offset, now, 0)
                    self.holes_refetched += 1
                if now - seen[2] >= HOLE_CONFIRM_SECONDS and seen[3] >= HOLE_CONFIRM_FETCHES:
                    route.hole = None  # real (compaction, transaction markers, retention): read past it
                    self.holes_read_past += 1
                    log.warning(
                        "%s[%d]: offsets %d..%d are missing from every answer for %.1f s (%d fetches): "
                        "a real hole (compaction, transaction markers or retention), read past",
                        tp.topic, tp.partition, expected, r.offset - 1, now - seen[2], seen[3],
                    )  # fmt: skip
                else:
                    route.hole = (*seen[:3], seen[3] + 1)
                    self.consumer.seek(tp, expected)
                    return records[:i]
            expected = r.offset + 1
        return records

    # -- gates ----------------------------------------------------------------------------
    def regate(
        self,
        layout_of: Callable[[str], TopicLayout | None],
        group_positions: Callable[[str], dict[int, int]],
        *,
        history: bool = False,
    ) -> GateEvents:
        """Recompute every gate from the layouts and the group's (fenced) positions.

        ``history``: the routes read the whole history of their partitions for a
        rebuild (``streamkit.runtime.rebuild``): their own positions, not the group's,
        say how far each partition was read, and gates follow the history
        (``gating.compute_gate``)."""
        events = GateEvents()
        gated = self._hold_activated_sweeps(layout_of)
        for topic in sorted({tp.topic for tp in self.routes}):
            layout = layout_of(topic)
            mine = {
                tp.partition: unswept for tp, routes in self.routes.items()
                if tp.topic == topic and (unswept := [r for r in routes if not r.swept])
            }  # fmt: skip
            if layout is None:
                continue
            local = {p: min(r.stable for r in routes) for p, routes in mine.items()}
            group = dict(group_positions(topic))
            for p, pos in local.items():
                group[p] = pos if history else max(group.get(p, 0), pos)
            tracker = self.trackers.setdefault(topic, GateTracker())
            update = tracker.update(layout, mine, group, local, history=history)
            altered = frozenset() if history or not holding(layout) else altered_by(layout)  # ``runtime.adoption``
            seals = seals_to_hold(mine, update.state.gates).get
            for p, gate in update.state.gates.items():
                tp = TopicPartition(topic, p)
                held = [self._apply_gate(tp, r, layout, gate, hold=p in altered, seal=seals(id(r))) for r in mine[p]]
                if all(held):  # every route of the partition is at its limit
                    self.consumer.pause(tp)
                else:
                    self.consumer.resume(tp)
                gated = gated or any(r.limit is not None for r in mine[p])
            events.revoked.update(TopicPartition(topic, p) for p in update.fire_revoked)
            events.assigned.update(TopicPartition(topic, p) for p in update.fire_assigned)
        self.gated = gated
        return events

    def _hold_activated_sweeps(self, layout_of: Callable[[str], TopicLayout | None]) -> bool:
        """A swept partition that a layout change activated forwards what lies below its
        activation and no more: from there its records are in place, for the processor the
        rebalance the change calls for gives it to. Whether any route is held so."""
        held = False
        for tp, routes in self.routes.items():
            layout = layout_of(tp.topic)
            if layout is None or layout.mode(tp.partition) == PartitionMode.NONE:
                continue
            for route in routes:
                if route.swept:
                    route.limit = layout.base_offset(tp.partition)
                    held = True
                    if route.position >= route.limit:
                        self.consumer.pause(tp)
        return held

    def _apply_gate(
        self,
        tp: TopicPartition,
        route: Route,
        layout: TopicLayout,
        gate: PartitionGate,
        *,
        hold: bool = False,
        seal: int | None = None,
    ) -> bool:
        """Set one route's gate; whether the route is held at its limit now. ``hold``: an
        announced change alters the partition's keys: the route stays where it is until
        the change is sealed (``runtime.adoption``). ``seal``: it stops there (``seals_to_hold``)."""
        if route.layout is not layout:
            route.layout = layout
            route.epoch_bytes = epoch_stamp(layout)
            route.stamps_current.clear()
            route.strays = stray_rule(layout, tp.partition, sweep_ends=self.sweep_ends(tp.topic, tp.partition))
        pos = route.position
        if pos < gate.start and route.strays is None:  # records below belong to an earlier incarnation
            if pos > 0:
                log.warning(
                    "%s: skipping offsets %d..%d of %s[%d]: written while it was not ReadWrite, "
                    "below the start of its current incarnation",
                    self.name,
                    pos,
                    gate.start - 1,
                    tp.topic,
                    tp.partition,
                )
            route.position = pos = gate.start
            self.consumer.seek(tp, self.fetch_position(tp))
        limit = gate.start if gate.skip else gate.limit
        if hold:
            limit = pos if limit is None else min(limit, pos)
        if seal is not None:
            limit = seal if limit is None else min(limit, seal)
        self._note_gate_wait(tp, route.limit, limit)
        if limit != route.limit:
            log.info(
                "%s: %s[%d] at %d: gate %s -> %s%s",
                self.name,
                tp.topic,
                tp.partition,
                pos,
                route.limit,
                limit,
                f" (waiting on {list(gate.waiting_on)})"
                if gate.waiting_on
                else " (its seal)"
                if seal is not None
                else "",
            )
        route.limit = limit
        return limit is not None and pos >= limit

    def _note_gate_wait(self, tp: TopicPartition, old: int | None, new: int | None) -> None:
        if new is not None and old is None:
            self.gate_closed_at[tp] = time.monotonic()
        elif new is None and tp in self.gate_closed_at:
            waited = time.monotonic() - self.gate_closed_at.pop(tp)
            self.gate_waits.append((tp.topic, tp.partition, waited))
            self.gate_wait_seconds.observe(waited)


def seals_to_hold(mine: dict[int, list[Route]], gates: Mapping[int, PartitionGate]) -> dict[int, int]:
    """Per route (``id``), the seal it stops at: a gate waiting only on partitions its own processor reads (a grown
    topic's old partitions of its keys) holds them at their seals, or their newer records would judge its late."""
    seals: dict[int, int] = {}
    for p, gate in gates.items():
        waits = [(q, need) for q, need in gate.waiting_on if need is not None]
        if gate.limit is None or gate.skip or not waits or len(waits) < len(gate.waiting_on):
            continue
        for route in mine[p]:
            blockers = [(id(b), need) for q, need in waits for b in mine.get(q, []) if b.proc is route.proc]
            if len(blockers) == len(waits):  # (else it waits on other processors' progress)
                seals.update((b, min(seals.get(b, need), need)) for b, need in blockers)
    return seals


def _keys_of(key_filter: KeyFilter, null_keys: bool, records: list[Any], until: int | None = None) -> list[Any]:
    """The records whose key hash ``key_filter`` accepts (keyless ones if ``null_keys``;
    exactly-once markers always: every sharer reads them), and every one from ``until``."""
    accepts, nk, marker, u = key_filter.accepts, null_keys, is_marker, until if until is not None else 1 << 62
    return [
        r for r in records if r.offset >= u or ((nk or marker(r)) if r.key is None else accepts(key_hash_cached(r.key)))
    ]
