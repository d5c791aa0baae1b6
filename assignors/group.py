"""The consumer-group assignor: processors onto members, partitions onto processors.

Runs on the group leader (aiokafka calls `assign`). Kept here, apart from the runtime,
like Kafka Streams keeps its assignor apart from its stream threads: the runtime only
supplies what each member knows (`MemberInfo`) and reads back `ProcessorAssignment`.

Two steps, both linear hashing:
1. logical processors 0..p-1 are spread over the live members, sticky to the ids each
   member hosted before (`assign_processors_to_members`);
2. every (topic, partition) goes to the processor(s) that linear hashing over the job's
   initial processor count p0 maps its keys to (`assign_partitions`), so key -> processor
   does not change when partitions are added.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import orjson
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from assignors.linear_hashing import nearest_ancestor_below
from assignors.placement import (
    KeyFilter,
    assign_partitions,
    assign_processors_to_members,
    processors_for_partition,
)
from assignors.standbys import place_actives, place_standbys

log = logging.getLogger(__name__)

PartitionSlot = tuple[str, int, "KeyFilter | None"]


@dataclass(frozen=True)
class TopicShape:
    """What placement needs of a topic's layout: n0, the active (ReadWrite) count, the
    partitions still draining after a shrink (ReadOnly), and the layout epoch."""

    n0: int
    active: int
    draining: tuple[int, ...] = ()
    epoch: int = 0
    swept: tuple[int, ...] = ()
    """Partitions no layout reads (mode None): read only to forward strays from them."""


@dataclass
class MemberInfo:
    """What a member tells the leader when it joins."""

    p0: int
    p: int
    hosted: list[int] = field(default_factory=list)
    # per topic: the layout this member follows; absent: the physical partition count
    layouts: dict[str, TopicShape] = field(default_factory=dict)
    standby_replicas: int = 0
    acceptable_lag: int = 10_000
    disk: str = ""
    """Where the member's worker keeps its stores (host and state directory; see
    ``assignors.standbys``); empty: a disk of its own."""
    copies: dict[int, int] = field(default_factory=dict)
    """Per processor whose store its disk holds (its own actives' included): that
    store's changelog position (only sent with standby replicas)."""

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "p0": self.p0,
                "p": self.p,
                "hosted": self.hosted,
                "layouts": {
                    t: [s.n0, s.active, list(s.draining), s.epoch, list(s.swept)] for t, s in self.layouts.items()
                },
                "standby_replicas": self.standby_replicas,
                "acceptable_lag": self.acceptable_lag,
                "disk": self.disk,
                "copies": {str(pid): pos for pid, pos in self.copies.items()},
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> MemberInfo | None:
        if not data:
            return None
        d = orjson.loads(data)
        layouts = {
            t: TopicShape(v[0], v[1], tuple(v[2]), v[3], tuple(v[4]) if len(v) > 4 else ())
            for t, v in d.get("layouts", {}).items()
        }
        copies = {int(pid): int(pos) for pid, pos in d.get("copies", {}).items()}
        replicas, lag = int(d.get("standby_replicas", 0)), int(d.get("acceptable_lag", 10_000))
        return cls(d["p0"], d["p"], list(d["hosted"]), layouts, replicas, lag, d.get("disk", ""), copies)


@dataclass
class ProcessorAssignment:
    """What a member receives: the processors it hosts and each one's partitions."""

    generation_hint: int
    p0: int
    p: int
    processors: dict[int, list[PartitionSlot]]
    epochs: dict[str, int] = field(default_factory=dict)
    sharers: dict[tuple[str, int], tuple[int, ...]] = field(default_factory=dict)
    """Per shared partition of this member's processors: every processor sharing it."""
    sweeps: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    """Per processor of this member: the partitions it reads only to forward strays."""
    standbys: list[int] = field(default_factory=list)
    """The processors this member keeps standby copies of."""
    warmups: list[int] = field(default_factory=list)
    """Those of ``standbys`` it is to take over once caught up (it then asks for a rebalance)."""
    members: int = 1
    """Members of the group this was placed for (a member that grows in place checks the
    spread against it)."""

    def outdated(self, p: int, shapes: Mapping[str, TopicShape]) -> str | None:
        """Why this assignment does not fit a job of ``p`` processors with topics of these
        ``shapes`` (None: it fits). A change seen during the rebalance can be newer than
        what the leader placed by (and aiokafka drops a rejoin asked for while joining)."""
        if p != self.p:
            return f"assignment placed {self.p} processors, the job has {p}"
        for topic, shape in shapes.items():
            if shape.epoch > self.epochs.get(topic, -1):
                return f"assignment used epoch {self.epochs.get(topic)} of {topic}, the layout is at {shape.epoch}"
        return None

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "p0": self.p0,
                "p": self.p,
                "g": self.generation_hint,
                "epochs": self.epochs,
                "processors": {
                    str(pid): [
                        [t, part, None if f is None else [f.modulus, sorted(f.residues)]] for t, part, f in slots
                    ]
                    for pid, slots in self.processors.items()
                },
                "sharers": [[t, part, list(pids)] for (t, part), pids in sorted(self.sharers.items())],
                "sweeps": {str(pid): [[t, part] for t, part in tps] for pid, tps in self.sweeps.items()},
                "standbys": self.standbys,
                "warmups": self.warmups,
                "members": self.members,
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> ProcessorAssignment:
        d = orjson.loads(data)
        procs: dict[int, list[PartitionSlot]] = {}
        for pid, slots in d["processors"].items():
            procs[int(pid)] = [
                (t, part, None if f is None else KeyFilter(f[0], frozenset(f[1]))) for t, part, f in slots
            ]
        sharers = {(t, part): tuple(pids) for t, part, pids in d.get("sharers", ())}
        sweeps = {int(pid): [(t, part) for t, part in tps] for pid, tps in d.get("sweeps", {}).items()}
        standbys = [int(pid) for pid in d.get("standbys", ())]
        warmups = [int(pid) for pid in d.get("warmups", ())]
        return cls(d.get("g", 0), d["p0"], d["p"], procs, dict(d.get("epochs", {})), sharers, sweeps, standbys, warmups,
                   max(1, int(d.get("members", 1))))  # fmt: skip


def processor_slots(shapes: Mapping[str, TopicShape], p0: int, p: int) -> dict[int, list[PartitionSlot]]:
    """Every processor's (topic, partition, key filter) slots for a job of ``p`` processors."""
    slots = assign_partitions({t: (s.n0, s.active) for t, s in shapes.items()}, p0, p)
    for topic, shape in shapes.items():
        for part in shape.draining:  # a draining partition's keys keep their processor
            for pid, key_filter in processors_for_partition(part, shape.n0, part + 1, p0, p).items():
                slots.setdefault(pid, []).append((topic, part, key_filter))
    return slots


def sweep_slots(shapes: Mapping[str, TopicShape], p0: int, p: int) -> dict[int, list[tuple[str, int]]]:
    """Per processor, the partitions no layout reads that it sweeps for strays: each goes
    to the (lowest) processor owning the keys of its nearest active ancestor, which
    also owns the partition once an expansion activates it (unless it is shared)."""
    sweeps: dict[int, list[tuple[str, int]]] = {}
    for topic, shape in sorted(shapes.items()):
        for part in shape.swept:
            home = nearest_ancestor_below(part, shape.n0, shape.active)
            pid = min(processors_for_partition(home, shape.n0, shape.active, p0, p))
            sweeps.setdefault(pid, []).append((topic, part))
    return sweeps


def sharers_of(slots: Mapping[int, list[PartitionSlot]]) -> dict[tuple[str, int], tuple[int, ...]]:
    """Per shared partition, every processor sharing it (ascending)."""
    sharers: dict[tuple[str, int], list[int]] = {}
    for pid, pid_slots in sorted(slots.items()):
        for t, part, key_filter in pid_slots:
            if key_filter is not None:
                sharers.setdefault((t, part), []).append(pid)
    return {tp: tuple(pids) for tp, pids in sharers.items()}


@dataclass(frozen=True)
class JobPlacement:
    """Where the processors of a job read: each one's slots, the partitions each one sweeps,
    and the processors sharing each shared partition."""

    slots: dict[int, list[PartitionSlot]]
    sweeps: dict[int, list[tuple[str, int]]]
    sharers: dict[tuple[str, int], tuple[int, ...]]

    def shared_only_among(self, pids: Iterable[int]) -> bool:
        """Whether no partition of ``pids`` is shared with a processor outside them."""
        pids = set(pids)
        return all(set(self.sharers.get((t, q), ())) <= pids for pid in pids for t, q, _ in self.slots.get(pid, ()))


def place_job(shapes: Mapping[str, TopicShape], p0: int, p: int) -> JobPlacement:
    slots = processor_slots(shapes, p0, p)
    return JobPlacement(slots, sweep_slots(shapes, p0, p), sharers_of(slots))


class StreamkitAssignor(AbstractPartitionAssignor):  # type: ignore[misc]  # aiokafka ships no types
    """One instance per consumer: `info` is sent on join, `assignment` is set on sync."""

    name = "streamkit-lh"
    version = 0

    def __init__(self, info: MemberInfo, refresh: Callable[[MemberInfo], None] | None = None) -> None:
        self.info = info
        self.refresh = refresh
        """Called before each join: what changes between joins (the copies a disk holds)."""
        self.assignment: ProcessorAssignment | None = None
        self._rounds = 0

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        if self.refresh is not None:
            self.refresh(self.info)
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics), self.info.encode())

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        self.assignment = ProcessorAssignment.decode(assignment.user_data)
        self.info.hosted = sorted(self.assignment.processors)

    def assign(
        self, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        self._rounds += 1
        infos: dict[str, MemberInfo] = {}
        for member_id, meta in members.items():
            info = MemberInfo.decode(meta.user_data)
            if info is None:
                raise ValueError(f"member {member_id} did not send streamkit member info")
            infos[member_id] = info
        p0, p = next(iter(infos.values())).p0, max(i.p for i in infos.values())
        topics = sorted({t for meta in members.values() for t in meta.subscription})
        shapes: dict[str, TopicShape] = {}
        epochs: dict[str, int] = {}
        for topic in topics:
            known = [i.layouts[topic] for i in infos.values() if topic in i.layouts]
            if known:  # the newest layout any member follows
                shapes[topic] = max(known, key=lambda s: s.epoch)
                epochs[topic] = shapes[topic].epoch
                continue
            parts = cluster.partitions_for_topic(topic)
            if not parts:
                log.warning("no partition metadata for topic %s; not assigning it", topic)
                continue
            shapes[topic] = TopicShape(len(parts), len(parts))
        placed = place_job(shapes, p0, p)
        slots, sweeps, sharers = placed.slots, placed.sweeps, placed.sharers
        together = [list(pids) for _, pids in sorted(sharers.items())]
        replicas = max(i.standby_replicas for i in infos.values())
        disks = {m: i.disk or m for m, i in infos.items()}  # a member naming no disk has one of its own
        copies = {m: i.copies for m, i in infos.items()}
        before: dict[str, list[int]] = {m: i.hosted for m, i in infos.items()}
        warmups: dict[str, list[int]] = {}
        if replicas > 0:  # each processor where a copy of its store is warm (KIP-441)
            lag = min(i.acceptable_lag for i in infos.values())
            hosting, warmups = place_actives(before, disks, copies, p, together, lag)
        else:
            hosting = assign_processors_to_members(before, p, together)
        standbys = place_standbys(hosting, disks, copies, replicas, p)
        for member, pids in warmups.items():
            standbys[member] = sorted(set(standbys.get(member, ())) | set(pids))
        result: dict[str, ConsumerProtocolMemberAssignment] = {}
        for member_id, pids in hosting.items():
            procs = {pid: slots.get(pid, []) for pid in pids}
            by_topic: dict[str, set[int]] = {}
            mine: dict[tuple[str, int], tuple[int, ...]] = {}
            for pid_slots in procs.values():
                for t, part, key_filter in pid_slots:
                    by_topic.setdefault(t, set()).add(part)
                    if key_filter is not None:
                        mine[(t, part)] = sharers[(t, part)]
            swept = {pid: sweeps[pid] for pid in pids if pid in sweeps}
            for t, part in (tp for tps in swept.values() for tp in tps):
                by_topic.setdefault(t, set()).add(part)
            user = ProcessorAssignment(
                self._rounds, p0, p, procs, epochs, mine, swept, standbys.get(member_id, []),
                warmups.get(member_id, []), len(infos),
            )  # fmt: skip
            result[member_id] = ConsumerProtocolMemberAssignment(
                self.version, sorted((t, sorted(ps)) for t, ps in by_topic.items()), user.encode()
            )
        return result
