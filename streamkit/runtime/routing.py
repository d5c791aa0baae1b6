"""How the partitions a processor is given become routes, and where each starts.

A member hosting a processor routes each of its partition slots (``Route.for_slot``: the
whole partition, or its key range of a shared one) and each partition it sweeps
(``Route.sweeping``: read only to forward strays), then records in the progress log
where the routes start: the group's fence and positions, the sweeps marked as such, and
the sweep ends it decided. The first processor to apply an activated partition in
place decides where the group's sweep of it ended (``strays.sweep_end``); the log's
first decision is the one every reader uses, so the routes' stray rules are set from it
once it is recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiokafka import TopicPartition

from assignors.group import PartitionSlot
from streamkit.app import HandlerSpec
from streamkit.kafkaio import KafkaIO
from streamkit.layout.registry import LayoutRegistry
from streamkit.layout.strays import activation, plain_rule, stray_rule, sweep_end
from streamkit.runtime.admission import Admission
from streamkit.runtime.copies import ScannedCopies, find_copies
from streamkit.runtime.progress import Commit, ProgressLog
from streamkit.runtime.routes import Route, SlotPlace
from streamkit.runtime.task import Task

log = logging.getLogger(__name__)


@dataclass
class Starts:
    """Where new routes start, as the progress log records them."""

    whole: dict[tuple[str, int], int | None] = field(default_factory=dict)
    shared: dict[tuple[str, int, int], tuple[int | None, tuple[int, ...]]] = field(default_factory=dict)
    """Per (topic, partition, processor) of a shared partition: its start and every sharer."""
    sweep_ends: dict[tuple[str, int, int], int] = field(default_factory=dict)
    """Per (topic, partition, activation offset): where the group's sweep ended (decided here)."""

    def update(self, other: Starts) -> None:
        self.whole.update(other.whole)
        self.shared.update(other.shared)
        self.sweep_ends.update(other.sweep_ends)


@dataclass(frozen=True)
class Router:
    """What routing uses: the handlers, the group's progress, the layouts, and the
    admission the routes go into."""

    name: str
    handlers: Mapping[str, list[HandlerSpec]]
    io: KafkaIO
    progress: ProgressLog
    registry: LayoutRegistry
    admission: Admission
    max_pending: int
    """Records a key-concurrent route may hold unfinished (``max_ic_ranges``)."""
    plain_partitions: Mapping[str, int] = field(default_factory=dict)
    """The input topics without a layout and their partition counts (``strays.plain_rule``)."""
    scanned: dict[str, ScannedCopies] = field(default_factory=dict)
    """Per topic, what this member read looking for copies (``copies.find_copies``)."""

    def slots(
        self,
        task: Task,
        slots: list[PartitionSlot],
        sharers_of: Mapping[tuple[str, int], tuple[int, ...]],
        p0: int,
        p: int,
    ) -> Starts:
        """Route ``task``'s slots (the consumer is sought afterwards)."""
        progress, proc = self.progress, task.proc
        starts = Starts()
        for topic, part, key_filter in slots:
            sharers = sharers_of.get((topic, part), ()) if key_filter is not None else ()
            group_pos = progress.position(topic, part, proc.id if sharers else None)
            layout = self.registry.get(topic)
            ends = dict(progress.sweep_ends(topic, part))
            end = sweep_end(layout, part, ends, progress.last_commit_swept(topic, part),
                            max(group_pos, proc.positions.get((topic, part), 0)))  # fmt: skip
            if end is not None:
                ends[end[0]] = starts.sweep_ends[(topic, part, end[0])] = end[1]
            route = Route.for_slot(
                proc, self.handlers[topic], (topic, part), group_pos, layout, SlotPlace(key_filter, sharers, p0, p),
                max_pending=self.max_pending, sweep_ends=ends,
            )  # fmt: skip
            if layout is None and topic in self.plain_partitions:
                route.strays = plain_rule(part, self.plain_partitions[topic])
            self._read(task, TopicPartition(topic, part), route)
            if sharers:
                starts.shared[(topic, part, proc.id)] = (route.position, sharers)
            else:
                starts.whole[(topic, part)] = route.position
            if group_pos > route.position:
                log.info("%s: processor %d rebuilds %s[%d] from %d to %d without output",
                         self.name, proc.id, topic, part, route.position, group_pos)  # fmt: skip
        return starts

    def sweeps(self, task: Task, sweeps: list[tuple[str, int]]) -> Starts:
        """Route the partitions ``task`` reads only to forward their strays."""
        starts = Starts()
        for topic, part in sweeps:
            group_pos = self.progress.position(topic, part, None)
            route = Route.sweeping(task.proc, self.handlers[topic], (topic, part), group_pos, self.registry.get(topic))
            self._read(task, TopicPartition(topic, part), route)
            starts.whole[(topic, part)] = route.position
        return starts

    def _read(self, task: Task, tp: TopicPartition, route: Route) -> None:
        """``task`` reads ``tp`` through ``route``, which admission admits for (the
        partition is fetched once for all its routes)."""
        task.read(tp, route)
        self.admission.add(tp, route)

    async def record(self, member: str, generation: int, epochs: Mapping[str, int], starts: Starts) -> None:
        """Look for the copies a dead sweep left beyond where the routes start (and let a
        sweep end decided here pass the last of them); record where the routes start and
        the sweep ends decided; then set the routes' stray rules from the log's sweep ends
        (the first recorded wins)."""
        progress = self.progress
        await self._find_copies(starts)
        swept = [(tp.topic, tp.partition) for tp, r in self.admission if r.swept]
        clean = [(tp.topic, tp.partition) for tp, r in self.admission if r.swept and not r.forwarded]
        commit = Commit(starts.whole, starts.shared, swept=swept, sweep_ends=starts.sweep_ends, no_copies_beyond=clean)
        await progress.record(member, generation, epochs, commit)
        decided = {(t, q) for t, q, _ in starts.sweep_ends}
        for tp, route in self.admission:
            if (tp.topic, tp.partition) in decided and not route.swept:
                route.strays = stray_rule(route.layout, tp.partition, sweep_ends=progress.sweep_ends(*tp))

    async def _find_copies(self, starts: Starts) -> None:
        """Set ``Route.forwarded`` of every new route that starts where a sweep may have
        forwarded beyond the group's position: a sweep whose partition holds records
        beyond it, or a route applying in place below where the sweep ended. A sweep end
        decided here is moved past the last copy found (below it, every unstamped record
        is a stray: applied through its copy)."""
        progress = self.progress
        looking: dict[str, dict[int, tuple[int, list]]] = {}
        for tp, route in self.admission:
            key = (tp.topic, tp.partition)
            if key not in starts.whole and not any(s[:2] == key for s in starts.shared):
                continue  # an older route: looked when it started
            start = max(route.position, progress.position(*key))
            ends = [e for (t, q, _), e in starts.sweep_ends.items() if (t, q) == key]
            ends += list(progress.sweep_ends(*key).values())
            if route.swept:
                look = progress.last_commit_swept(*key)
            else:  # a partition that was never swept has no strays forwarded from it
                look = (
                    route.layout is not None
                    and activation(route.layout, tp.partition) is not None
                    and (progress.last_commit_swept(*key) or any(start < e for e in ends))
                )
            if look:
                looking.setdefault(tp.topic, {}).setdefault(tp.partition, (start, []))[1].append(route)
        for topic, parts in looking.items():
            ends_now = await self.io.topic_ends(topic)
            parts = {q: v for q, v in parts.items() if ends_now.get(q, 0) > v[0]}  # nothing beyond: no copies
            if not parts:
                continue
            found = await find_copies(
                self.io, topic, {q: start for q, (start, _) in parts.items()},
                {q: progress.copies_after(topic, q) for q in parts}, self.registry.origin_seal,
                self.scanned.setdefault(topic, ScannedCopies()),
            )  # fmt: skip
            for q, (start, routes) in parts.items():
                copied = frozenset(found[q])
                for route in routes:
                    route.forwarded = copied
                if copied:
                    log.warning(
                        "%s: %s[%d]: %d strays from offset %d on were forwarded by a sweep that stopped before its "
                        "checkpoint; their copies stand, they are not forwarded again",
                        self.name, topic, q, len(copied), start,
                    )  # fmt: skip
                for k in [k for k in starts.sweep_ends if k[:2] == (topic, q)]:
                    if copied:
                        starts.sweep_ends[k] = max(starts.sweep_ends[k], max(copied) + 1)
