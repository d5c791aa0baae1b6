"""Finding the copies of strays that a sweep forwarded beyond the group's position.

A sweep forwards a stray and moves the group's position past it only at its next
checkpoint. A sweeper that dies in between leaves copies of strays beyond the
position. The next reader of the partition starts at the position: forwarding those
strays again is harmless while the layout is the same (the copy lands where the first
did, and its receiver drops it by origin, ``strays.SeenStrays``), but after a layout
change it can land elsewhere, where a second processor, or the same one through
another partition, would apply it again. So a reader starting where copies may lie
first looks for them: every stray has copies in one partition only, and a stray whose
copy exists is not forwarded again.

Where to look: each swept position the progress log records with no copy beyond it
carries the topic's ends then (``ProgressLog.copies_after``); copies forwarded later lie
after them. Without such a record the whole topic is read, once per process: what it
found and how far it read are kept (``ScannedCopies``), so a later look, at a later
rebalance, reads only what the topic gained since the look before the last one. A copy
is appended, so one not seen then lies beyond those ends, except a batch still in flight
then: Tansu hands out a batch's offsets before it writes it, and a read passes a hole
that stays for a second. By the look after, such a batch has landed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from streamkit.kafkaio import KafkaIO
from streamkit.layout.seal import OriginSeal

log = logging.getLogger(__name__)

__all__ = ["ScannedCopies", "find_copies"]

SCAN_BYTES = 4 << 20


@dataclass
class ScannedCopies:
    """What this process read of one topic looking for copies: per origin partition, the
    offsets of its strays with a copy (all of them, whatever the start asked for then),
    and per partition how far its last look read for that origin (``read_to``) and how
    far the look before (``settled``: where the next look begins)."""

    copies: dict[int, set[int]] = field(default_factory=dict)
    read_to: dict[int, dict[int, int]] = field(default_factory=dict)
    settled: dict[int, dict[int, int]] = field(default_factory=dict)

    def forget_if_shorter(self, ends: Mapping[int, int]) -> None:
        """A partition that ends below where it was read: the topic was recreated."""
        if any(end > ends.get(x, 0) for per in self.read_to.values() for x, end in per.items()):
            self.copies.clear()
            self.read_to.clear()
            self.settled.clear()

    def begin(self, origin: int, partition: int) -> int:
        return self.settled.get(origin, {}).get(partition, 0)

    def looked(self, origin: int, partition: int, end: int) -> None:
        read = self.read_to.setdefault(origin, {})
        self.settled.setdefault(origin, {})[partition] = read.get(partition, 0)
        read[partition] = max(end, read.get(partition, 0))


async def find_copies(
    io: KafkaIO,
    topic: str,
    starts: Mapping[int, int],
    after: Mapping[int, Mapping[int, int] | None],
    seal: OriginSeal,
    scanned: ScannedCopies | None = None,
) -> dict[int, set[int]]:
    """Per origin partition ``q`` of ``starts``: the offsets at or beyond ``starts[q]``
    whose strays have a forwarded copy in ``topic``. ``after[q]``: where, per partition,
    copies of ``q``'s strays beyond ``starts[q]`` can lie at the earliest (None: anywhere).
    ``seal``: the cluster's, which a copy's origin must carry (a record that merely has
    the header must not stop a stray from being forwarded). ``scanned``: what earlier
    looks of this process read (updated)."""
    scanned = scanned if scanned is not None else ScannedCopies()
    ends = await io.topic_ends(topic)
    scanned.forget_if_shorter(ends)
    scanned_count = 0
    for x, end in sorted(ends.items()):
        begin = min(max(0 if (b := after.get(q)) is None else b.get(x, 0), scanned.begin(q, x)) for q in starts)
        pos = begin
        while pos < end:
            records, _ = await io.fetch_at(topic, x, pos, end, max_bytes=SCAN_BYTES)
            if not records:
                break
            for r in records:
                if (origin := seal.origin(topic, r)) is not None and origin[0] in starts:
                    scanned.copies.setdefault(origin[0], set()).add(origin[1])
            pos = records[-1].offset + 1
            scanned_count += len(records)
        for q in starts:
            scanned.looked(q, x, pos)
    found = {q: {o for o in scanned.copies.get(q, ()) if o >= start} for q, start in starts.items()}
    log.info(
        "%s: looked for copies of strays from partitions %s (%d records read): %s",
        topic, sorted(starts), scanned_count, {q: len(v) for q, v in found.items()},
    )  # fmt: skip
    return found
