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
after them. Without such a record the whole topic is read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from streamkit.kafkaio import KafkaIO
from streamkit.layout.strays import STRAY_HEADER, parse_origin

log = logging.getLogger(__name__)

__all__ = ["find_copies"]

SCAN_BYTES = 4 << 20


async def find_copies(
    io: KafkaIO, topic: str, starts: Mapping[int, int], after: Mapping[int, Mapping[int, int] | None]
) -> dict[int, set[int]]:
    """Per origin partition ``q`` of ``starts``: the offsets at or beyond ``starts[q]``
    whose strays have a forwarded copy in ``topic``. ``after[q]``: where, per partition,
    copies of ``q``'s strays beyond ``starts[q]`` can lie at the earliest (None: anywhere)."""
    found: dict[int, set[int]] = {q: set() for q in starts}
    ends = await io.topic_ends(topic)
    scanned = 0
    for x, end in sorted(ends.items()):
        begin = min((0 if (b := after.get(q)) is None else b.get(x, 0)) for q in starts)
        pos = begin
        while pos < end:
            records, _ = await io.fetch_at(topic, x, pos, end, max_bytes=SCAN_BYTES)
            if not records:
                break
            for r in records:
                for name, value in r.headers:
                    if name == STRAY_HEADER and (origin := parse_origin(value)) is not None:
                        q, o = origin
                        if q in found and o >= starts[q]:
                            found[q].add(o)
            pos = records[-1].offset + 1
            scanned += len(records)
    log.info(
        "%s: looked for copies of strays from partitions %s (%d records read): %s",
        topic, sorted(starts), scanned, {q: len(v) for q, v in found.items()},
    )  # fmt: skip
    return found
