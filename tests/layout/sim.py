"""An in-memory world for gating tests: partition logs, producers following the change
protocol (with lag, or missing changes), and a consumer group delivering through the
gate.  Everything is deterministic given a ``random.Random``.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from streamkit.layout import model, transitions
from streamkit.layout.gating import compute_gate
from streamkit.layout.model import PartitionMode, TopicLayout
from streamkit.layout.stamps import RecordStatus, classify_record


@dataclass(frozen=True)
class Rec:
    producer: int
    key: bytes
    seq: int
    epoch: int


@dataclass
class SimProducer:
    pid: int
    layout: TopicLayout
    fenced: bool = False
    """Never switches (it missed every change): its records after a seal are late."""
    seqs: dict[bytes, int] = field(default_factory=lambda: defaultdict(int))


class World:
    def __init__(self, rng: random.Random, n0: int = 2, capacity: int = 16, producers: int = 2, keys: int = 24):
        self.rng = rng
        self.layout = transitions.create("sim", n0, capacity=capacity, now_ms=0)
        self.logs: dict[int, list[Rec]] = {p: [] for p in range(capacity)}
        self.producers = [SimProducer(i, self.layout) for i in range(producers)]
        self.keys = [f"key-{i}".encode() for i in range(keys)]
        self.hashes = {k: key_hash(k) for k in self.keys}
        self.unacked: set[int] = set()
        # consumer side
        self.local: dict[int, int] = {}
        self.committed: dict[int, int] = {}
        self.delivered: list[tuple[int, int, Rec]] = []
        self.verdicts: dict[tuple[int, int], object] = {}
        self.now = 0

    # ---------------------------------------------------------------- producing

    def produce(self, i: int | None = None, key: bytes | None = None) -> None:
        pr = self.producers[self.rng.randrange(len(self.producers)) if i is None else i]
        key = key if key is not None else self.rng.choice(self.keys)
        p = lh_bucket(self.hashes[key], pr.layout.n0, pr.layout.active)
        pr.seqs[key] += 1
        self.logs[p].append(Rec(pr.pid, key, pr.seqs[key], pr.layout.epoch))

    def hws(self, parts) -> dict[int, int]:
        return {p: len(self.logs[p]) for p in parts}

    # ---------------------------------------------------------------- changes

    def announce(self) -> bool:
        lay = self.layout
        if lay.pending is not None:
            return False
        options = []
        if not lay.draining and lay.active < lay.physical:
            options.append("expand")
        if lay.active > lay.n0:
            options.append("shrink")
        if lay.draining:
            options.append("finish")
        if not options:
            return False
        what = self.rng.choice(options)
        self.now += 1000
        if what == "expand":
            n2 = self.rng.randint(lay.active + 1, min(lay.physical, lay.active * 2 + 1))
            self.layout = transitions.expand(lay, n2, announce_offsets=self.hws(range(lay.physical)), now_ms=self.now)
        elif what == "shrink":
            n2 = self.rng.randint(lay.n0, lay.active - 1)
            self.layout = transitions.shrink(lay, n2, 0, announce_offsets=self.hws(lay.readable), now_ms=self.now)
        else:
            # give up only what the group has drained (so that every record is delivered)
            done = [d for d in lay.draining if self.committed.get(d, 0) >= self._drain_end(d)]
            if not done:
                return False
            self.layout = transitions.finish_drain(lay, done, now_ms=self.now, force=True)
            return True
        self.unacked = {p.pid for p in self.producers if not p.fenced}
        return True

    def _drain_end(self, d: int) -> int:
        for s in reversed(self.layout.seals):
            if s.kind == model.ChangeKind.SHRINK and d in s.partitions:
                return s.seal_offset(d) if s.sealed else 1 << 60
        return 0

    def wake_fenced(self) -> bool:
        """A fenced (paused) producer wakes up and catches up with the current layout."""
        lagging = [p for p in self.producers if p.fenced and p.layout.epoch < self.layout.epoch]
        if not lagging or self.layout.pending is not None:
            return False
        self.rng.choice(lagging).layout = self.layout
        return True

    def switch_one(self) -> bool:
        if self.layout.pending is None or not self.unacked:
            return False
        pid = self.rng.choice(sorted(self.unacked))
        self.producers[pid].layout = self.layout
        self.unacked.discard(pid)
        return True

    def seal(self) -> bool:
        lay = self.layout
        if lay.pending is None or self.unacked:
            return False
        fenced = [str(p.pid) for p in self.producers if p.fenced]
        self.layout = transitions.seal(lay, self.hws(lay.readable), fenced=fenced)
        return True

    # ---------------------------------------------------------------- consuming

    def deliver_one(self) -> bool:
        lay = self.layout
        readable = [p for p in lay.readable]
        gate = compute_gate(lay, readable, self.committed)
        cands = []
        for p in readable:
            g = gate.gates[p]
            pos = max(self.local.get(p, 0), g.start)
            self.local[p] = pos
            if pos < len(self.logs[p]) and g.deliverable(pos):
                cands.append(p)
        if not cands:
            return False
        p = self.rng.choice(cands)
        off = self.local[p]
        rec = self.logs[p][off]
        self.delivered.append((p, off, rec))
        self.verdicts[(p, off)] = classify_record(lay, p, off, rec.epoch, self.hashes[rec.key])
        self.local[p] = off + 1
        return True

    def commit(self) -> None:
        self.committed = dict(self.local)

    def verdict(self, p: int, off: int, rec: Rec):
        """The verdict when the record was delivered (by the layout of that moment)."""
        return self.verdicts[(p, off)]

    # ---------------------------------------------------------------- checks

    def order_violations(self) -> list[tuple[int, int, Rec]]:
        """Delivered records whose seq is not above every earlier one of (producer, key)."""
        last: dict[tuple[int, bytes], int] = {}
        bad = []
        for p, off, r in self.delivered:
            k = (r.producer, r.key)
            if r.seq <= last.get(k, 0):
                bad.append((p, off, r))
            last[k] = max(last.get(k, 0), r.seq)
        return bad

    def drain_all(self, max_steps: int = 100_000) -> None:
        """Deliver and commit until nothing moves (liveness check)."""
        for _ in range(max_steps):
            moved = False
            while self.deliver_one():
                moved = True
            before = dict(self.committed)
            self.commit()
            if not moved and before == self.committed:
                return
        raise AssertionError("drain_all did not settle")

    def undelivered(self) -> dict[int, int]:
        out = {}
        for p in self.layout.readable:
            start = self.layout.base_offset(p)
            left = len(self.logs[p]) - max(self.local.get(p, 0), start)
            if left > 0:
                out[p] = left
        return out

    def mode(self, p: int) -> PartitionMode:
        return self.layout.mode(p)


def run_random(rng: random.Random, steps: int, *, fenced: int = 0, **kw) -> World:
    w = World(rng, **kw)
    for i in range(fenced):
        w.producers[-1 - i].fenced = True
    ops = ["produce"] * 8 + ["announce", "switch", "switch", "seal", "deliver", "deliver", "deliver", "commit"]
    if fenced:
        ops.append("wake")
    for _ in range(steps):
        op = rng.choice(ops)
        if op == "produce":
            w.produce()
        elif op == "announce":
            w.announce()
        elif op == "switch":
            w.switch_one()
        elif op == "seal":
            w.seal()
        elif op == "wake":
            w.wake_fenced()
        elif op == "deliver":
            w.deliver_one()
        else:
            w.commit()
    # finish the pending change, then drain everything
    while w.switch_one():
        pass
    w.seal()
    w.drain_all()
    return w


__all__ = ["Rec", "RecordStatus", "SimProducer", "World", "run_random"]
