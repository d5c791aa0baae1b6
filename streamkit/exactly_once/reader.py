"""Reading exactly once: a processor applies a record sent exactly once
(``streamkit.exactly_once.markers``) only once its attempt is known committed.

Per input partition (a *source*) the gate keeps what it learned from the markers it
passed (per writer: the newest incarnation, the last committed attempt) and a queue of
the records from the first undecided one on, in offset order, as Kafka's
``read_committed`` stops at the last stable offset: a record is decided by that table,
else by the first marker of its writer queued after it:

- a commit marker of its incarnation and an attempt at or beyond its own: committed;
- a commit marker of a newer incarnation: aborted (that incarnation announced itself
  earlier in the partition, so the record came from an incarnation already replaced);
- a recovery marker of a newer incarnation: committed if it names the record's
  incarnation with an attempt at or beyond its own, else aborted (a crash, or a zombie);
- a recovery marker of its own incarnation (it announces itself at its first
  checkpoint, after its first records): the next marker decides.

Committed records go on to the merge and the handlers; aborted ones are dropped
(counted); a record with no attempt (a plain producer, a job without exactly-once) is
applied as it comes, in its turn. Queued records are pending for the processor (its
checkpoint's stable offset stays below them: a restart reads them again), and their
partition counts as lagging for the time-ordered merge, which waits for them as for
records not fetched yet. The table goes into the processor's checkpoint (``to_extra``):
atomic with its state, in its changelog, with the processor wherever it goes. It goes in
as of the checkpoint's stable offset (the markers learned beyond it left out: a restart
reads them again, with the records around them, and decides those alike).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from streamkit.exactly_once.markers import (
    ATTEMPT_HEADER,
    COMMIT_HEADER,
    RECOVER_HEADER,
    Attempt,
    Marker,
    attempt_of,
    is_marker,
    marker_of,
)

__all__ = ["EOS_SEEN", "CommitGate", "SourceGate", "without_markers"]

EOS_SEEN = "eos_seen"
"""Checkpoint extra: per source ("topic/partition"), per writer, [newest incarnation,
its last committed attempt]."""

Source = tuple[str, int]


def without_markers(records: list[Any]) -> list[Any]:
    """``records`` less the markers (a reader that does not process exactly once)."""
    if not any(r.key is None and not r.value for r in records):
        return records
    return [r for r in records if not is_marker(r)]


@dataclass
class WriterSeen:
    current: int = 0
    """The newest incarnation of the writer a marker showed: a record of an older one
    that comes after it was sent by a zombie, or by a process that died, uncommitted
    (whatever of the older incarnations was committed came before that marker)."""
    committed: int = 0
    """The current incarnation's last committed attempt (0: none yet)."""


@dataclass
class SourceGate:
    """One input partition's table and queue (see the module docstring)."""

    seen: dict[str, WriterSeen] = field(default_factory=dict)
    """What the markers passed said (what decides)."""
    saved: dict[str, WriterSeen] = field(default_factory=dict)
    """The table as of the offset the last checkpoint recorded (``compact``)."""
    learned: list[tuple[int, Marker]] = field(default_factory=list)
    """The markers passed since, with their offsets."""
    queue: deque[tuple[Any, bool, Attempt | Marker | None]] = field(default_factory=deque)
    """(record, rebuild, its attempt or marker) from the first undecided record on."""
    markers: dict[str, deque[Marker]] = field(default_factory=dict)
    """Per writer, the markers in the queue, in order."""

    def push(self, rec: Any, again: bool) -> None:
        if rec.key is None and not rec.value and (marker := marker_of(rec)) is not None:
            self.queue.append((rec, again, marker))
            self.markers.setdefault(marker.writer, deque()).append(marker)
        else:
            self.queue.append((rec, again, attempt_of(rec)))

    def release(self, rebuild: list[Any], deliver: list[Any]) -> int:
        """Take off the queue's head what is decided: committed records into ``rebuild``
        and ``deliver``, markers into the table; returns how many aborted records were
        dropped."""
        dropped = 0
        queue = self.queue
        while queue:
            rec, again, what = queue[0]
            if isinstance(what, Marker):
                _learn(self.seen, what)
                self.learned.append((rec.offset, what))
                self.markers[what.writer].popleft()
            elif what is not None:
                decided = self._decide(what)
                if decided is None:
                    break
                if decided:
                    (rebuild if again else deliver).append(rec)
                else:
                    dropped += 1
            else:
                (rebuild if again else deliver).append(rec)
            queue.popleft()
        return dropped

    def _decide(self, attempt: Attempt) -> bool | None:
        seen = self.seen.get(attempt.writer)
        if seen is not None:
            if attempt.incarnation < seen.current:
                return False
            if attempt.incarnation == seen.current and attempt.n <= seen.committed:
                return True
        for m in self.markers.get(attempt.writer, ()):
            if m.recovered is None:
                if m.incarnation == attempt.incarnation and m.n >= attempt.n:
                    return True
                if m.incarnation > attempt.incarnation:
                    return False
            elif m.incarnation > attempt.incarnation:
                return attempt.n <= m.recovered.get(attempt.incarnation, 0)
        return None

    def table_at(self, offset: int) -> dict[str, WriterSeen]:
        """The table as of ``offset``: the markers passed below it learned."""
        table = {w: WriterSeen(s.current, s.committed) for w, s in self.saved.items()}
        for at, marker in self.learned:
            if at < offset:
                _learn(table, marker)
        return table

    def compact(self, offset: int) -> None:
        """A checkpoint recorded ``offset``: the table as of it is the one to start from."""
        if self.learned and self.learned[0][0] < offset:
            self.saved = self.table_at(offset)
            self.learned = [(at, m) for at, m in self.learned if at >= offset]

    def forget_from(self, offset: int) -> None:
        """Forget the markers read at or past ``offset`` (read ahead of where the reading
        goes on: it reads them again, in their turn): the table as of ``offset``, and the
        queue without them."""
        self.seen = self.table_at(offset)
        self.learned = [(at, m) for at, m in self.learned if at < offset]
        queue = self.queue
        while queue and queue[-1][0].offset >= offset:
            _, _, what = queue.pop()
            if isinstance(what, Marker):
                self.markers[what.writer].pop()

    def held_offsets(self) -> Iterator[int]:
        return (rec.offset for rec, _, _ in self.queue)


_EOS_HEADERS = frozenset((ATTEMPT_HEADER, COMMIT_HEADER, RECOVER_HEADER))


def _pass_plain(records: list[Any], out: list[Any]) -> list[Any]:
    """Move the records before the first one with an exactly-once header into ``out``;
    return the rest."""
    names = _EOS_HEADERS
    for i, rec in enumerate(records):
        if rec.headers and any(h[0] in names for h in rec.headers):
            out.extend(records[:i])
            return records[i:]
    out.extend(records)
    return []


def _learn(table: dict[str, WriterSeen], m: Marker) -> None:
    seen = table.setdefault(m.writer, WriterSeen())
    if m.incarnation > seen.current:
        seen.current, seen.committed = m.incarnation, 0
    if m.incarnation == seen.current and m.recovered is None:
        seen.committed = max(seen.committed, m.n)


class CommitGate:
    """A processor's gates, one per source it reads (see the module docstring)."""

    def __init__(self, extra: dict[str, Any] | None = None) -> None:
        self.sources: dict[Source, SourceGate] = {}
        self.dropped = 0
        """Records of aborted attempts dropped (a crash or a zombie upstream)."""
        self.load(extra or {})

    def load(self, extra: dict[str, Any]) -> None:
        """The tables as a checkpoint's ``extra`` holds them; the queues emptied (a rewind:
        what they held is read again from the checkpoint's positions)."""
        self.sources = {}
        for where, writers in (extra.get(EOS_SEEN) or {}).items():
            topic, _, partition = where.rpartition("/")
            gate = self.sources[(topic, int(partition))] = SourceGate()
            for writer, (current, committed) in writers.items():
                gate.seen[writer] = WriterSeen(int(current), int(committed))
                gate.saved[writer] = WriterSeen(int(current), int(committed))

    def to_extra(self, positions: Mapping[Source, int]) -> dict[str, Any]:
        """The tables as of the checkpoint's ``positions`` (its stable offsets)."""
        out: dict[str, Any] = {}
        for source, gate in sorted(self.sources.items()):
            table = gate.table_at(positions.get(source, 0)) if gate.learned else gate.saved
            if table:
                out[f"{source[0]}/{source[1]}"] = {w: [s.current, s.committed] for w, s in sorted(table.items())}
        return out

    def compact(self, positions: Mapping[Source, int]) -> None:
        """A checkpoint recording ``positions`` is in the store."""
        for source, gate in self.sources.items():
            gate.compact(positions.get(source, 0))

    def admit(self, source: Source, rebuild: list[Any], deliver: list[Any]) -> tuple[list[Any], list[Any], set[int]]:
        """A partition batch through the gate: the records to apply now (rebuilt ones,
        delivered ones) and the offsets no longer queued (released or dropped)."""
        gate = self.sources.get(source)
        if gate is None:
            gate = self.sources[source] = SourceGate()
        out_rebuild: list[Any] = []
        out_deliver: list[Any] = []
        if not gate.queue:  # what carries nothing of exactly-once passes as it is, up to the first that does
            rebuild = _pass_plain(rebuild, out_rebuild)
            if not rebuild:
                deliver = _pass_plain(deliver, out_deliver)
        before = set(gate.held_offsets()) if gate.queue else set()
        for records, again in ((rebuild, True), (deliver, False)):
            for rec in records:
                gate.push(rec, again)
        self.dropped += gate.release(out_rebuild, out_deliver)
        freed = before - set(gate.held_offsets()) if before else set()
        return out_rebuild, out_deliver, freed

    def holds(self, source: Source) -> bool:
        gate = self.sources.get(source)
        return gate is not None and bool(gate.queue)

    def forget_from(self, source: Source, offset: int) -> None:
        """``SourceGate.forget_from`` for ``source``."""
        if (gate := self.sources.get(source)) is not None:
            gate.forget_from(offset)

    def held(self, source: Source) -> Iterable[int]:
        gate = self.sources.get(source)
        return gate.held_offsets() if gate is not None else ()
