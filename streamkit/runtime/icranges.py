"""Individual commit (IC) ranges: what a partition's processor applied beyond its stable offset.

A processor that applies records out of offset order (key-level concurrency) cannot
describe its progress by one offset. Its checkpoint holds, per partition:

- the **stable offset**: every record below it is applied;
- **IC ranges**: sorted, disjoint, non-touching inclusive ``(first, last)`` offset ranges
  above the stable offset whose records are applied too.

Between checkpoints the runtime keeps only what is simple to keep: the records handed to
handlers and not finished yet (*pending*), the next offset to fetch (the *cursor*), and
the ranges loaded from the last checkpoint that the cursor has not reached. A checkpoint
derives the stable offset and the ranges from these (`snapshot`). After a restart the
partition is read again from the stable offset and records inside the ranges are
skipped (*gap amending*, `skip_applied`); ranges are dropped as the cursor passes them.

Ranges travel in store checkpoints as JSON pairs and in progress records in a compact
form (`encode`/`decode`: deltas as unsigned LEB128 varints, zlib, base64), so that
100,000 ranges fit well inside a Kafka message.
"""

from __future__ import annotations

import base64
import bisect
import zlib
from collections.abc import Iterable, Sequence

Range = tuple[int, int]


def merge(ranges: Iterable[Range]) -> list[Range]:
    """Sorted, disjoint ranges, merged where they overlap or touch."""
    out: list[Range] = []
    for first, last in sorted(ranges):
        if first > last:
            raise ValueError(f"empty range ({first}, {last})")
        if out and first <= out[-1][1] + 1:
            if last > out[-1][1]:
                out[-1] = (out[-1][0], last)
        else:
            out.append((first, last))
    return out


def snapshot(pending: Iterable[int], cursor: int, ahead: Sequence[Range] = ()) -> tuple[int, list[Range]]:
    """(stable offset, IC ranges) of a partition whose records below ``cursor`` are
    applied except ``pending``, and whose records in ``ahead`` (ranges at or beyond the
    cursor, from an earlier checkpoint) are applied too."""
    waiting = sorted(set(pending))
    if waiting and waiting[-1] >= cursor:
        raise ValueError(f"pending offset {waiting[-1]} at or beyond the cursor {cursor}")
    if not waiting:
        return cursor, merge(ahead)
    ranges = [(a + 1, b - 1) for a, b in zip(waiting, waiting[1:], strict=False) if b - a > 1]
    if cursor - 1 > waiting[-1]:
        ranges.append((waiting[-1] + 1, cursor - 1))
    return waiting[0], merge([*ranges, *ahead])


def compact(ranges: Sequence[Range], stable: int) -> list[Range]:
    """The ranges above ``stable`` (the stable offset passed the others)."""
    i = bisect.bisect_right(ranges, (stable, 1 << 63))
    out = list(ranges[i:])
    if i and ranges[i - 1][1] >= stable:  # a range the stable offset is inside of
        out.insert(0, (stable, ranges[i - 1][1]))
    return out


def skip_applied(offsets: Sequence[int], ranges: Sequence[Range]) -> tuple[list[int], int]:
    """Gap amending: the indexes of ``offsets`` (ascending) outside ``ranges``, and how
    many were inside (applied before the restart)."""
    keep: list[int] = []
    j = 0
    for i, off in enumerate(offsets):
        while j < len(ranges) and ranges[j][1] < off:
            j += 1
        if j < len(ranges) and ranges[j][0] <= off:
            continue
        keep.append(i)
    return keep, len(offsets) - len(keep)


def _varints(values: Iterable[int]) -> bytes:
    out = bytearray()
    for v in values:
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def _unvarints(data: bytes) -> list[int]:
    out: list[int] = []
    v = shift = 0
    for b in data:
        v |= (b & 0x7F) << shift
        if b & 0x80:
            shift += 7
        else:
            out.append(v)
            v = shift = 0
    return out


def encode(stable: int, ranges: Sequence[Range]) -> str:
    """A compact text form of ranges above ``stable``: each range as (gap from the previous
    end, length), varints, zlib, base64."""
    deltas: list[int] = []
    prev = stable - 1
    for first, last in ranges:
        if first <= prev or last < first:
            raise ValueError(f"ranges must be sorted, disjoint and above {stable}: ({first}, {last}) after {prev}")
        deltas += (first - prev - 1, last - first)
        prev = last
    return base64.b64encode(zlib.compress(_varints(deltas), 6)).decode()


def decode(stable: int, text: str) -> list[Range]:
    deltas = _unvarints(zlib.decompress(base64.b64decode(text)))
    ranges: list[Range] = []
    prev = stable - 1
    for gap, length in zip(deltas[::2], deltas[1::2], strict=True):
        first = prev + 1 + gap
        ranges.append((first, first + length))
        prev = first + length
    return ranges
