"""The commit gate's rule (``streamkit.exactly_once.reader``), on plain records: over
randomized histories of writers that crash before or after their markers, come back as
new incarnations, leave zombies sending on, and are retired by shrinks (perhaps killed
between their last checkpoint and its markers, so that only the processor receiving
their keys can end them), a reader that restarts from its checkpoints at random applies
exactly the committed records, each once, in the partition's order, and holds nothing
once every writer has committed again. The worker tests run it against the broker
(``test_pipeline``)."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from streamkit.checkpoint_keys import RETIRED
from streamkit.exactly_once.markers import marker_of, recover_header
from streamkit.exactly_once.reader import CommitGate
from streamkit.exactly_once.writer import EOS_COMMITTED, AttemptWriter, incarnation_of, recovered_in, retired_in

SOURCE = ("t", 0)


@dataclass
class Rec:
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


@dataclass
class Writer:
    """A writer as the log sees it: its store's checkpoint, its live incarnation, its zombies."""

    name: str
    generations: itertools.count[int]
    """The group's generations: each new incarnation opens in a newer one."""
    store: dict[str, Any] = field(default_factory=dict)
    """The checkpoint's extra."""
    live: AttemptWriter = field(init=False)
    zombies: list[AttemptWriter] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.start()

    def start(self) -> None:
        recovered, retired = recovered_in(self.name, self.store), retired_in(self.store, 0)
        self.live = AttemptWriter(self.name, incarnation_of(next(self.generations)), recovered, retired)


class Log:
    def __init__(self) -> None:
        self.records: list[Rec] = []
        self.committed_ids: set[int] = set()
        self.attempt_of: dict[int, tuple[str, int, int]] = {}
        self.committed_attempts: set[tuple[str, int, int]] = set()
        self.marked: dict[tuple[str, int], int] = {}
        """Per (writer, incarnation), the last attempt a marker committed."""

    def send(self, writer: AttemptWriter) -> None:
        offset = len(self.records)
        self.records.append(Rec(offset, b"k", str(offset).encode(), (writer.header("t"),)))
        self.attempt_of[offset] = (writer.writer, writer.incarnation, writer.n)

    async def mark(self, topic: str, header: tuple[str, bytes]) -> None:
        rec = Rec(len(self.records), None, b"", (header,))
        self.records.append(rec)
        m = marker_of(rec)
        assert m is not None
        for inc, n in ((m.incarnation, m.n),) if m.recovered is None else m.recovered.items():
            self.marked[m.writer, inc] = max(self.marked.get((m.writer, inc), 0), n)

    def plain(self) -> None:
        offset = len(self.records)
        self.records.append(Rec(offset, b"p", str(offset).encode(), ()))
        self.committed_ids.add(offset)


def commit(log: Log, w: Writer, markers: bool) -> None:
    """The writer's store commits its attempt (``EOS_COMMITTED``); its markers go out
    unless it is killed first."""
    live = w.live
    if (kept := live.committing()) is not None:
        w.store[EOS_COMMITTED] = kept
    w.store[RETIRED] = live.retired_owed()
    if live.topics:
        log.committed_attempts.add((live.writer, live.incarnation, live.n))
    live.stored()
    if markers:
        asyncio.run(live.committed(log.mark, ["t"]))


def reopen(rng: random.Random, log: Log, w: Writer) -> None:
    """A new incarnation of ``w``: its markers go out when its routes start (before any
    record), unless it is killed first (then at its first checkpoint)."""
    w.start()
    if rng.random() < 0.7:
        asyncio.run(w.live.committed(log.mark, ["t"]))


def retire(rng: random.Random, log: Log, w: Writer, receiver: Writer, markers: bool, late: set[int]) -> None:
    """A shrink retires ``w`` into ``receiver``: ``w`` checkpoints a last time (killed
    before its markers unless ``markers``) and never runs again; the receiver, which goes
    on from the group's positions (behind an unmarked checkpoint, so it sends that
    output again), opens a new incarnation whose store names ``w`` (``RETIRED``)."""
    commit(log, w, markers)
    if not markers:  # what no marker committed is aborted: the receiver sends it again
        log.committed_attempts -= {
            (name, inc, n) for name, inc, n in log.committed_attempts
            if name == w.name and n > log.marked.get((name, inc), 0)
        }  # fmt: skip
    w.zombies.append(w.live)  # (perhaps only paused: it may send on, never to be committed)
    late.difference_update(id(z) for z in w.zombies)  # (its zombies are fenced: no late markers)
    commit(log, receiver, markers=True)  # the receiver's checkpoint at the handover
    pid = int(w.name.rpartition("/")[2])
    receiver.store[RETIRED] = sorted({*receiver.store.get(RETIRED, []), *w.store.get(RETIRED, []), pid})
    receiver.zombies.append(receiver.live)
    reopen(rng, log, receiver)


def history(rng: random.Random, writers: int, steps: int) -> Log:
    log = Log()
    generations = itertools.count(2)
    ws = [Writer(f"up/{i}", generations) for i in range(writers)]
    retired: list[Writer] = []
    late: set[int] = set()
    for _ in range(steps):
        w = rng.choice(ws)
        roll = rng.random()
        if roll > 0.97 and len(ws) > 1:
            ws.remove(w)
            retired.append(w)
            retire(rng, log, w, rng.choice(ws), rng.random() < 0.5, late)
            continue
        if 0.82 <= roll < 0.88 and retired and rng.random() < 0.3:
            w = rng.choice(retired)  # a zombie of a retired writer wakes up
        if roll < 0.55:
            log.send(w.live)
        elif roll < 0.7:
            commit(log, w, markers=True)
        elif roll < 0.75:
            commit(log, w, markers=False)  # committed, then killed (or paused) before its markers
            late.add(id(w.live))
            w.zombies.append(w.live)
            reopen(rng, log, w)
        elif roll < 0.82:
            w.zombies.append(w.live)  # killed (or paused) mid-attempt
            reopen(rng, log, w)
        elif roll < 0.88 and w.zombies:
            zombie = rng.choice(w.zombies)  # a paused one wakes up and sends on (its next commits are fenced)
            if id(zombie) in late:  # paused between its store commit and its markers: they go out now
                late.discard(id(zombie))
                asyncio.run(zombie.committed(log.mark, ["t"]))
            log.send(zombie)
        elif roll < 0.9:
            log.plain()
    for w in ws:  # every writer commits once more: every attempt is decided
        log.send(w.live)
        commit(log, w, markers=True)
    for offset, attempt in log.attempt_of.items():
        if attempt in log.committed_attempts:
            log.committed_ids.add(offset)
    return log


def read(rng: random.Random, log: Log) -> tuple[list[int], CommitGate]:
    """A reader fed in random batches, restarting from a checkpoint now and then: the
    offsets it applied, in the order applied. What the gate releases is not always applied
    at once (a time-ordered merge may hold it): the checkpoint records the stable offset
    below what is not applied yet and the offsets applied beyond it (IC ranges), and a
    restart reads again from the stable offset, skipping those (not the markers, as
    admission does)."""
    gate = CommitGate()
    applied: list[int] = []
    merge: list[int] = []  # released, not applied yet
    checkpoint: tuple[dict[str, object], int, set[int], int] = ({}, 0, set(), 0)
    position = 0
    while position < len(log.records):
        batch = log.records[position : position + rng.randint(1, 6)]
        position += len(batch)
        beyond = checkpoint[2]
        batch = [r for r in batch if r.offset not in beyond or r.key is None]
        _, deliver, _ = gate.admit(SOURCE, [], batch)
        merge.extend(int(r.value) for r in deliver)
        for _ in range(rng.randint(0, len(merge))):
            applied.append(merge.pop(0))
        if rng.random() < 0.15:
            stable = min([*gate.held(SOURCE), *merge, position])
            ranges = {o for o in applied if o >= stable}
            checkpoint = ({"eos_seen": gate.to_extra({SOURCE: stable})}, stable, ranges, len(applied))
            gate.compact({SOURCE: stable})
        if rng.random() < 0.05:  # a crash: back to the checkpoint
            extra, position, _, kept = checkpoint
            del applied[kept:]
            merge = []
            gate = CommitGate(extra)
    applied.extend(merge)
    return applied, gate


SEEDS = int(os.environ.get("STREAMKIT_EOS_SEEDS", "300"))


@pytest.mark.parametrize("chunk", range(4))
def test_a_reader_applies_exactly_the_committed_records_once_in_order(chunk: int) -> None:
    for seed in range(chunk, SEEDS, 4):
        rng = random.Random(seed)
        log = history(rng, writers=rng.randint(1, 3), steps=rng.randint(20, 200))
        applied, gate = read(rng, log)
        assert sorted(applied) == sorted(log.committed_ids), f"seed {seed}"
        assert len(set(applied)) == len(applied), f"seed {seed}: applied twice"
        assert not gate.holds(SOURCE), f"seed {seed}: something is still held"


def test_a_reader_that_applies_as_it_comes_shows_the_duplicates() -> None:
    """Without the gate the same histories apply aborted records: the test can fail."""
    aborted = 0
    for seed in range(50):
        log = history(random.Random(seed), writers=2, steps=150)
        sent = [r.offset for r in log.records if r.value]
        aborted += len(set(sent) - log.committed_ids)
    assert aborted > 0


def test_markers_never_reach_a_reader_that_does_not_process_exactly_once() -> None:
    from streamkit.exactly_once.reader import without_markers

    log = Log()
    w = AttemptWriter("up/0", incarnation_of(1), [])
    log.send(w)
    asyncio.run(log.mark("t", recover_header("up/0", w.incarnation, [])))
    log.plain()
    assert [r.offset for r in without_markers(log.records)] == [0, 2]
