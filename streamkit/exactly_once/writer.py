"""Writing exactly once: a processor's output stamped with its attempt, and the markers
its checkpoints write (``streamkit.exactly_once.markers``).

The commit decision is the processor's store commit: its checkpoint records the attempt
(``EOS_COMMITTED``) atomically with its state and input positions. Only then are the
attempt's commit markers written, so a crash between the two leaves an attempt that is
committed without markers: the next incarnation, opened from that checkpoint, announces
it as recovered, which commits it downstream and aborts everything else the incarnations
before sent. Until that announcement is out, every checkpoint keeps the list of such
attempts (several, if incarnations die in a row before announcing).

A processor a shrink retires may have died in that window too, and it never runs again:
the processor that received its keys announces it as ended (a recovery marker of the
retired writer with nothing committed, under the receiver's own, newer, incarnation).
That is right because the receiver goes on from the group's positions of the retired
processor's partitions (its progress log), which are written only after the markers of
every attempt they cover (a checkpoint's, after its markers; where an opened processor's
routes start, after its recovery marker and the markers its store owes): what the retired
writer committed beyond them without markers is sent again by the receiver, so it must
be aborted. (Windows are left, each an instant wide, then the shrink before the processor
runs again: a crash of the retiring or the receiving processor between a checkpoint's
markers and its progress record, after which the receiver sends that checkpoint's output
again; and a crash between the store commit of a read of a partition the processor no
longer consumes, whose output no group position covers, and its markers, sent right
after it, after which that output is lost.)
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from streamkit.checkpoint_keys import RETIRED
from streamkit.exactly_once.markers import Attempt, commit_header, recover_header

__all__ = ["EOS_COMMITTED", "AttemptWriter", "Writers", "incarnation_of", "recovered_in", "retired_in"]

EOS_COMMITTED = "eos_committed"
"""Checkpoint extra: [writer, [[incarnation, attempt], ...]]: the last committed attempt
of each incarnation no marker may have told of yet, this one's last (the writer named: a
store seeded from another processor's keeps its marks)."""

_COUNTER = itertools.count(1)

Mark = Callable[[str, tuple[str, bytes]], Awaitable[None]]
"""``mark(topic, header)``: write a marker with ``header`` into every partition of
``topic`` and wait until the broker has them (``streamkit.producer.Producer.mark``)."""


def incarnation_of(generation: int) -> int:
    """A new incarnation number: the group generation it is opened in, then a counter of
    this process (a processor is opened again in one generation only by the process
    that hosts it), so that it only grows over a processor's life."""
    return (max(generation, 0) << 24) | (next(_COUNTER) & 0xFFFFFF)


class AttemptWriter:
    """One hosted processor's output attempts."""

    def __init__(
        self, writer: str, incarnation: int, recovered: list[tuple[int, int]], retired: Iterable[int] = ()
    ) -> None:
        self.writer = writer
        self.incarnation = incarnation
        self.recovered = recovered
        """Per incarnation before, its last committed attempt that no marker may have told
        of (from the checkpoint): what the recovery marker announces."""
        self.retired = sorted(retired)
        """Processors retired into this one, whose writers this incarnation's first
        checkpoint announces as ended (from the checkpoint, ``RETIRED``)."""
        self.n = 1
        """The attempt under way."""
        self.topics: set[str] = set()
        """Topics sent to in the attempt under way."""
        self.announced = False
        self.owed: list[tuple[int, set[str]]] = []
        """Attempts a store commit recorded whose commit markers are not out yet, with
        their topics."""
        self._header = Attempt(writer, incarnation, 1).header()

    def header(self, topic: str) -> tuple[str, bytes]:
        """The header of a record sent to ``topic`` now."""
        self.topics.add(topic)
        return self._header

    def committing(self) -> list[Any] | None:
        """What the checkpoint being written records (``EOS_COMMITTED``): the attempts
        not announced yet, and this incarnation's attempt under way if it sent anything,
        else its last committed one (None: nothing to keep)."""
        pairs = [] if self.announced else [list(p) for p in self.recovered]
        n = self.n if self.topics else self.n - 1
        if n > 0:
            pairs.append([self.incarnation, n])
        return [self.writer, pairs] if pairs else None

    def retired_owed(self) -> list[int]:
        """The retired processors the checkpoint being written keeps (``RETIRED``): those
        not announced yet."""
        return [] if self.announced else self.retired

    def stored(self) -> None:
        """A store commit recorded :meth:`committing` (the member's checkpoint, or any
        other commit of the processor's store: a rebuild's beside it): the attempt under
        way is committed; what is sent from now on is the next one. Its markers are owed."""
        if self.topics:
            self.owed.append((self.n, self.topics))
            self.topics = set()
            self.n += 1
            self._header = Attempt(self.writer, self.incarnation, self.n).header()

    async def committed(self, mark: Mark, declared: Iterable[str]) -> None:
        """After a checkpoint: announce this incarnation (at its first checkpoint), then
        the commit markers owed."""
        if not self.announced:
            header = recover_header(self.writer, self.incarnation, self.recovered)
            for topic in sorted(set(declared) | {t for _, topics in self.owed for t in topics}):
                await mark(topic, header)
            app = self.writer.rpartition("/")[0]
            for pid in self.retired:  # ended: nothing of theirs is committed beyond their markers
                for topic in sorted(declared):
                    await mark(topic, recover_header(f"{app}/{pid}", self.incarnation, ()))
            self.announced = True
        while self.owed:
            n, topics = self.owed[0]
            header = commit_header(Attempt(self.writer, self.incarnation, n))
            for topic in sorted(topics):
                await mark(topic, header)
            self.owed.pop(0)


def recovered_in(writer: str, extra: Mapping[str, Any]) -> list[tuple[int, int]]:
    """The committed attempts a checkpoint's ``extra`` keeps for ``writer``."""
    kept = extra.get(EOS_COMMITTED)
    if not (isinstance(kept, list) and len(kept) == 2 and kept[0] == writer):
        return []
    return [(int(inc), int(n)) for inc, n in kept[1]]


def retired_in(extra: Mapping[str, Any], active: int) -> list[int]:
    """The retired processors a checkpoint's ``extra`` keeps (``RETIRED``), of those still
    retired with ``active`` processors (one the job grew back to runs as itself)."""
    kept = extra.get(RETIRED)
    if not isinstance(kept, list):
        return []
    return [pid for pid in kept if isinstance(pid, int) and pid >= active]


class Writers:
    """The attempt writers of a worker's hosted processors, by processor id: what the
    output stamps records with (``streamkit.runtime.output.Output``)."""

    def __init__(self, app: str) -> None:
        self.app = app
        self.by_processor: dict[int, AttemptWriter] = {}

    def open(self, pid: int, generation: int, extra: Mapping[str, Any], active: int) -> AttemptWriter:
        """A new incarnation of processor ``pid`` of a job of ``active`` processors, from its
        checkpoint's ``extra``."""
        name = f"{self.app}/{pid}"
        recovered, retired = recovered_in(name, extra), retired_in(extra, active)
        writer = self.by_processor[pid] = AttemptWriter(name, incarnation_of(generation), recovered, retired)
        return writer

    def close(self, pid: int, writer: AttemptWriter) -> None:
        if self.by_processor.get(pid) is writer:
            del self.by_processor[pid]
