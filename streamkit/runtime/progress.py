"""The group's progress, fenced by generation: streamkit's own commit log.

Kafka's committed offsets are what other members see of our progress (T1 of a processor bootstrap, docs/design.md)
and what gates ordered delivery (the group positions of KIP-253). A zombie (a member that
was paused through a rebalance) must not move them. Kafka brokers refuse a commit from
an old generation, but the reference broker does not (measured: Tansu 0.6 accepts a
stale generation, and drops commit metadata), so every commit is also written here,
stamped with the member's generation and layout epochs, and readers keep, per
partition, only records of the newest generation seen for it. A member about to
checkpoint reads this log first: if a newer generation owns one of its partitions, it
is the zombie, and its checkpoint is rejected (see `checkpointing`).

Records (topic `__streamkit_progress`, one partition, key = group; "st": see below):
    {"group", "member", "gen", "epochs": {topic: epoch}, "parts": [[topic, partition, offset|null]],
     "shares": [[topic, partition, processor, offset|null, [sharers]]],
     "ic": [[topic, partition, processor, stable offset, IC ranges (icranges.encode)]]}
`offset` null is a fence: "generation `gen` owns this partition now" (written when an
assignment arrives, before the member knows its positions). Optional:
    "swept": [[topic, partition]]: which of "parts" a sweep committed (a partition no
        layout reads, read only to forward its strays);
    "sweep_ends": [[topic, partition, activation offset, end]]: where the sweep of a
        partition that an expansion activated ended (the first record of the partition
        the group applies in place; the first such record in the log wins);
    "st": [[topic, partition, stream time]]: the committing processor's stream time with a
        whole partition's position (windows; ``ProgressLog.stream_time``);
    "copies_after": [[topic, partition, [[partition, offset]]]]: for a swept position
        recorded with no copy of a stray at or beyond it in the topic, each partition's
        end then: copies of the partition's strays beyond the position lie after these
        ends (what a reader starting there scans to find them, `copies.find_copies`).

A shared partition (several processors each own a key range of it, possibly on
different members) has one position per sharer, under "shares", with the list of all
its sharers. The partition's group position is the lowest of them, and only once every
sharer of the current list has reported; until then the position it had before stays
(the floor). A sharer's own position is what it resumes its output from.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import orjson
from aiokafka import AIOKafkaProducer

from streamkit.internal_records import (
    INT,
    OBJECT,
    OPT_INT,
    STR,
    Malformed,
    decode_guarded,
    list_of,
    load_object,
    optional,
    required,
    row_of,
    rows,
)
from streamkit.kafkaio import KafkaIO
from streamkit.runtime import icranges

log = logging.getLogger(__name__)

PROGRESS_TOPIC = "__streamkit_progress"

TP = tuple[str, int]
Share = tuple[str, int, int]
"""(topic, partition, processor) of a shared partition."""


@dataclass
class Rejected:
    member: str
    generation: int
    newer: int
    partition: TP


@dataclass
class _Owner:
    generation: int
    offset: int
    sharers: tuple[int, ...] = ()
    """Empty: one processor owns the whole partition."""
    shares: dict[int, int] = field(default_factory=dict)
    floor: int = 0
    swept: bool = False
    """The offset was committed by a sweep (strays forwarded, nothing applied)."""
    copies_after: dict[int, int] | None = None
    """Where copies of strays beyond the last swept offset can lie at the earliest (per
    partition of the topic; None: anywhere). Kept through positions applied in place."""
    stream_time: int = -1
    """The stream time of the processor that committed ``offset`` (a whole partition of a
    job with windows; -1: none), as its checkpoint had it: the time a processor taking
    the partition over goes on from, so that it takes the closes it made for sent."""

    def settle(self) -> None:
        if self.sharers and all(p in self.shares for p in self.sharers):
            self.offset = max(self.floor, min(self.shares[p] for p in self.sharers))


@dataclass
class ProgressLog:
    io: KafkaIO
    producer: AIOKafkaProducer
    group: str
    _state: dict[TP, _Owner] = field(default_factory=dict)
    _offset: int = 0
    rejected: list[Rejected] = field(default_factory=list)
    _ic: dict[Share, tuple[int, str]] = field(default_factory=dict)
    _sweep_ends: dict[TP, dict[int, int]] = field(default_factory=dict)

    async def start(self) -> None:
        await self.io.create_topic(PROGRESS_TOPIC, 1, configs={"retention.ms": "-1", "retention.bytes": "-1"})
        await self.refresh()

    async def refresh(self) -> None:
        """Read the log to its high watermark."""
        recs, end = await self.io.read(PROGRESS_TOPIC, 0, self._offset)
        key = self.group.encode()
        for rec in recs:
            if rec.key == key and rec.value:
                d = decode_guarded(rec, partial(decode_progress, rec.value))
                if d is not None:  # a malformed record is skipped: it changes nothing
                    self._apply(d)
        self._offset = max(self._offset, end)

    def _apply(self, d: Mapping[str, Any]) -> None:
        if d.get("reset"):  # `streamkit reset --cluster`: the job starts over
            self._state.clear()
            self._ic.clear()
            self._sweep_ends.clear()
            return
        gen = int(d["gen"])
        swept = {(t, int(q)) for t, q in d.get("swept", ())}
        bounds = {(t, int(q)): {int(x): int(o) for x, o in ends} for t, q, ends in d.get("copies_after", ())}
        times = {(t, int(q)): int(at) for t, q, at in d.get("st", ())}
        for topic, part, offset in d["parts"]:
            cur = self._admit(d, (topic, part), gen)
            if cur is not False:
                base = cur.offset if cur is not None else 0
                after = bounds.get((topic, part), cur.copies_after if cur is not None else None)
                if offset is None:
                    swept_before = cur.swept if cur is not None else False
                    at = cur.stream_time if cur is not None else -1
                    self._state[(topic, part)] = _Owner(
                        gen, base, swept=swept_before, copies_after=after, stream_time=at
                    )
                else:  # (a position recorded again as it was, a start's: its stream time stays)
                    kept = cur.stream_time if cur is not None and cur.offset == int(offset) else -1
                    self._state[(topic, part)] = _Owner(
                        gen, int(offset), swept=(topic, part) in swept, copies_after=after,
                        stream_time=times.get((topic, part), kept),
                    )  # fmt: skip
        for topic, part, pid, offset, sharers in d.get("shares", ()):
            cur = self._admit(d, (topic, part), gen)
            if cur is False:
                continue
            sharers = tuple(sharers)
            if cur is None or cur.sharers != sharers:  # newly shared, or shared otherwise
                base, swept_before = (cur.offset, cur.swept) if cur is not None else (0, False)
                after = cur.copies_after if cur is not None else None
                cur = self._state[(topic, part)] = _Owner(gen, base, sharers, {}, base, swept_before, after)
            cur.generation = gen
            if offset is not None:
                cur.shares[int(pid)] = max(cur.shares.get(int(pid), 0), int(offset))
                cur.swept = False  # a sharer applies its key range in place
            cur.settle()
        for topic, part, pid, base, text in d.get("ic", ()):
            cur = self._state.get((topic, part))
            if cur is None or gen >= cur.generation:
                self._ic[(topic, part, int(pid))] = (int(base), text)
        for topic, part, activation, end in d.get("sweep_ends", ()):
            if (cur := self._state.get((topic, int(part)))) is not None and gen < cur.generation:
                continue  # a zombie's, written after the partition's new owner decided its own
            self._sweep_ends.setdefault((topic, int(part)), {}).setdefault(int(activation), int(end))

    def sweep_ends(self, topic: str, partition: int) -> dict[int, int]:
        """Per activation offset of the partition (an expansion made it active), where the
        group's sweep of it ended: unstamped records below were forwarded as strays."""
        return self._sweep_ends.get((topic, partition), {})

    def last_commit_swept(self, topic: str, partition: int) -> bool:
        """Whether the group's position of the partition was last moved by a sweep (or
        never moved): nothing of it was applied in place up to there."""
        cur = self._state.get((topic, partition))
        return cur is None or cur.offset == 0 or cur.swept

    def copies_after(self, topic: str, partition: int) -> dict[int, int] | None:
        """Per partition of the topic, the offset beyond which copies of ``partition``'s
        strays forwarded past the group's last swept position lie (None: unknown, read
        from the start)."""
        cur = self._state.get((topic, partition))
        return None if cur is None else cur.copies_after

    def ic_ranges(self, topic: str, partition: int, processor: int) -> list[tuple[int, int]]:
        """The IC ranges a processor last recorded for a partition (applied beyond its
        stable offset then)."""
        found = self._ic.get((topic, partition, processor))
        return icranges.decode(*found) if found else []

    def _admit(self, d: Mapping[str, Any], tp: TP, gen: int) -> _Owner | None | Literal[False]:
        """The partition's state if a record of generation ``gen`` may update it (None:
        unknown yet), False if a newer generation owns it (the record is rejected)."""
        cur = self._state.get(tp)
        if cur is not None and gen < cur.generation:
            self.rejected.append(Rejected(str(d["member"]), gen, cur.generation, tp))
            log.warning(
                "progress of %s[%d] from generation %d (member %s) rejected: generation %d owns it",
                tp[0],
                tp[1],
                gen,
                d["member"],
                cur.generation,
            )
            return False
        return cur

    def position(self, topic: str, partition: int, processor: int | None = None) -> int:
        """The group's position of a partition: the newest generation's last commit (0:
        none; the lowest sharer's for a shared partition). With ``processor``: that
        sharer's own position, if it has one."""
        cur = self._state.get((topic, partition))
        if cur is None:
            return 0
        if processor is not None and processor in cur.shares:
            return cur.shares[processor]
        return cur.offset

    def stream_time(self, topic: str, partition: int) -> int:
        """The stream time that came with a whole partition's group position (-1: none)."""
        cur = self._state.get((topic, partition))
        return -1 if cur is None or cur.sharers else cur.stream_time

    def positions(self, topic: str) -> dict[int, int]:
        return {p: o.offset for (t, p), o in self._state.items() if t == topic}

    def newest_generation(self, partitions: Iterable[TP]) -> int:
        return max((self._state[tp].generation for tp in partitions if tp in self._state), default=-1)

    async def record(self, member: str, generation: int, epochs: Mapping[str, int], commit: Commit) -> None:
        """Append ``member``'s ``commit`` (or fence, for offsets None) of ``generation`` under
        the layout ``epochs``, and wait until it is stored."""
        parts, shares, ic, swept, sweep_ends, no_copies_beyond, stream_times = (
            commit.parts, commit.shares, commit.ic, commit.swept, commit.sweep_ends, commit.no_copies_beyond,
            commit.stream_times,
        )  # fmt: skip
        if not parts and not shares and not ic and not sweep_ends:
            return
        body: dict[str, Any] = {
            "group": self.group,
            "member": member,
            "gen": generation,
            "epochs": dict(epochs),
            "parts": [[t, p, o] for (t, p), o in sorted(parts.items())],
        }
        if shares:
            body["shares"] = [[t, p, pid, o, list(of)] for (t, p, pid), (o, of) in sorted(shares.items())]
        if ic:
            body["ic"] = [[t, p, pid, base, text] for (t, p, pid), (base, text) in sorted(ic.items())]
        if stream_times and (at := sorted((tp, t) for tp, t in stream_times.items() if tp in parts and t >= 0)):
            body["st"] = [[t, p, st] for (t, p), st in at]
        if swept := sorted(tp for tp in swept if tp in parts):
            body["swept"] = [list(tp) for tp in swept]
        if sweep_ends:
            body["sweep_ends"] = [[t, p, a, e] for (t, p, a), e in sorted(sweep_ends.items())]
        clean = set(no_copies_beyond)
        if bounded := [tp for tp in swept if tp in clean]:
            ends = {t: await self.io.topic_ends(t) for t in {t for t, _ in bounded}}
            body["copies_after"] = [[t, p, sorted(ends[t].items())] for t, p in bounded]
        await self.producer.send_and_wait(PROGRESS_TOPIC, orjson.dumps(body), key=self.group.encode(), partition=0)
        await self.refresh()  # read our own write in log order (applying it out of order would misjudge)


@dataclass(frozen=True)
class Commit:
    """What one progress record says, besides who wrote it (see :meth:`ProgressLog.record`)."""

    parts: Mapping[TP, int | None]
    """Per whole partition, its position (None: a fence, no position yet)."""
    shares: Mapping[Share, tuple[int | None, tuple[int, ...]]] | None = None
    """Per (topic, partition, processor) of a shared partition, the sharer's offset (or
    None) and every sharer of the partition."""
    ic: Mapping[Share, tuple[int, str]] | None = None
    """Per (topic, partition, processor), its stable offset and its IC ranges beyond it
    (``icranges.encode``)."""
    swept: Iterable[TP] = ()
    """Which of ``parts`` are sweeps' positions."""
    sweep_ends: Mapping[tuple[str, int, int], int] | None = None
    """Per (topic, partition, activation offset), where its sweep ended
    (:meth:`ProgressLog.sweep_ends`)."""
    no_copies_beyond: Iterable[TP] = ()
    """Which of ``swept`` have no copy of a stray at or beyond their position anywhere: the
    topic's ends are read and recorded with them (:meth:`ProgressLog.copies_after`)."""
    stream_times: Mapping[TP, int] | None = None
    """Per partition of ``parts``, the stream time of the processor that committed it
    (:meth:`ProgressLog.stream_time`)."""


def decode_progress(value: bytes | None) -> dict[str, Any]:
    """One record of the progress log, checked to have the shape :meth:`ProgressLog.record`
    (or :func:`forget_progress`) writes: Malformed (or a JSON error) if not, so that applying
    it cannot fail half way."""
    d = load_object(value)
    if "reset" in d and (reset := d["reset"]) is not False:
        if reset is not True:
            raise Malformed("reset is not true or false")
        return d
    required(d, "gen", INT)
    required(d, "member", STR)
    optional(d, "epochs", OBJECT)
    required(d, "parts", list_of(row_of(STR, INT, OPT_INT)))
    rows(d, "shares", STR, INT, INT, OPT_INT, list_of(INT))
    for topic, part, pid, base, text in rows(d, "ic", STR, INT, INT, INT, STR):
        try:
            icranges.decode(base, text)
        except Exception as exc:  # noqa: BLE001 - whatever the decoder says, it is not IC ranges
            raise Malformed(f"ic of {topic}[{part}] (processor {pid}) is not IC ranges: {exc}") from None
    rows(d, "swept", STR, INT)
    rows(d, "sweep_ends", STR, INT, INT, INT)
    rows(d, "st", STR, INT, INT)
    rows(d, "copies_after", STR, INT, list_of(row_of(INT, INT)))
    return d


async def forget_progress(io: KafkaIO, group: str) -> None:
    """Append a reset record for ``group``: readers forget every position before it."""
    producer = AIOKafkaProducer(**io.connection.client_kwargs(), acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(PROGRESS_TOPIC, orjson.dumps({"reset": True}), key=group.encode(), partition=0)
    finally:
        await producer.stop()
