"""Epoch stamps on records, and what a consumer makes of them.

A stamp is one header, ``sk`` (:data:`STAMP_HEADER`): six hex digits naming its
producer, then the layout epoch the producer placed it with, in ASCII digits.  The
producer writes it **once per record batch**, on the batch's first record (every record
of a batch shares its producer and epoch), and on every record that carries headers
of its own; a header-less record of a batch whose first record is stamped carries that
stamp (:func:`batch_stamp`: the fetch paths hand it to those records).  Once per batch
because a header's cost is paid per record: the client builds a list, a tuple, a key
string and a value for each, and a consumer ran at 0.77x on records stamped one by one.
Records stamped one by one (earlier versions, and records with headers of their own)
and the two headers of older versions (``streamkit.epoch`` and ``streamkit.producer``)
are still read (:func:`record_epoch`, :func:`record_producer`).  :func:`classify_record`
tells the consumer what a record is:

- ``NEWER``: stamped with an epoch newer than the consumer's layout: the layout is
  stale.  Refresh it (``LayoutRegistry.ensure_at_least``) and gate again *before*
  delivering: records of moved keys exist only after their announcement, so a
  consumer that sees one re-reads and finds the change (this replaces KIP-253's
  broker-side fetch check).
- ``LATE``: stamped ``e_r`` and lying at or beyond the ``seal_offsets`` of a later
  sealed change: its producer missed that change (it was fenced).  Offsets are
  immutable, so it cannot be re-routed: if its key moved since ``e_r`` (``moved``),
  delivering it would break the key's order or apply it to state that moved away.
  The runtime must report it (counter + a violation record naming producer, key,
  partition, offset, record epoch and seal epoch; ``violation_record``) and not
  apply it silently.  A late record whose key did not move is harmless.
- ``MISPLACED``: stamped ``e_r`` but on a partition that was not ReadWrite at
  ``e_r``, or not where ``e_r``'s layout puts its key (a foreign or buggy writer).
- ``DEAD``: below the start of the partition's current incarnation (skip it).
- ``UNSTAMPED``: no epoch header (a foreign producer): cannot be checked.
- ``OK``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from assignors.linear_hashing import lh_bucket
from streamkit.layout.model import ChangeKind, TopicLayout

__all__ = [
    "COPY_HEADER",
    "EPOCH_HEADER",
    "NO_HEADERS",
    "PRODUCER_HEADER",
    "STAMP_HEADER",
    "TAG_BYTES",
    "RecordStatus",
    "RecordVerdict",
    "batch_stamp",
    "classify_record",
    "is_copy",
    "record_epoch",
    "stamp_epoch",
    "record_producer",
    "stamp",
    "violation_record",
]

STAMP_HEADER = "sk"
"""The stamp: a producer's tag (:data:`TAG_BYTES` ASCII characters), then the epoch in digits."""
TAG_BYTES = 6
"""The producer tag's length: six hex digits that end the producer's id (``client-0a1b2c``).
Text, so that tools reading headers as UTF-8 can show every stamped record."""
COPY_HEADER = "sk.copy"
"""First header of a record that is a copy for compaction (KIP-253's rule for compacted
topics): a keyed record written to a partition its key was split from, so that compaction
drops the key's stale value there; its value names the partition of the original.
Consumers skip it (:func:`is_copy`)."""
EPOCH_HEADER = "streamkit.epoch"
"""Earlier stamps: the layout epoch the record's producer placed it with."""
PRODUCER_HEADER = "streamkit.producer"
"""Earlier stamps: the id of the streamkit producer that wrote the record."""


def stamp(tag: bytes, epoch: int) -> tuple[str, bytes]:
    """The stamp header of a record placed at layout ``epoch`` by the producer ``tag``."""
    if len(tag) != TAG_BYTES or not tag.isascii():
        raise ValueError(f"a producer tag has {TAG_BYTES} ASCII characters, not {tag!r}")
    return STAMP_HEADER, tag + b"%d" % epoch


Headers = tuple[tuple[str, bytes], ...]
NO_HEADERS: Headers = ()


def batch_stamp(first_headers: Sequence[tuple[str, bytes]] | None) -> Headers:
    """The headers a batch's header-less records carry: the stamp of its first record (at
    the batch's base offset), or nothing when that record is not stamped.  Only the
    record at the base offset counts: if compaction removed it, the batch's other
    records are unstamped (and checked as a foreign producer's would be)."""
    if first_headers and (h := first_headers[0])[0] == STAMP_HEADER:
        return ((h[0], h[1]),)
    return NO_HEADERS


def epoch_bytes(epoch: int) -> bytes:
    """What follows the tag in a stamp of ``epoch`` (compare ``value[TAG_BYTES:]``)."""
    return b"%d" % epoch


class RecordStatus(str, enum.Enum):
    OK = "ok"
    UNSTAMPED = "unstamped"
    NEWER = "newer"
    LATE = "late"
    MISPLACED = "misplaced"
    DEAD = "dead"


@dataclass(frozen=True)
class RecordVerdict:
    status: RecordStatus
    record_epoch: int | None = None
    seal_epoch: int | None = None
    """The first sealed change the record's producer missed (LATE)."""
    moved: bool = False
    """The record's key is placed elsewhere by a later layout than its own."""

    @property
    def violation(self) -> bool:
        """True when delivering it as a normal record could break per-key order."""
        return (self.status == RecordStatus.LATE and self.moved) or self.status == RecordStatus.MISPLACED


def stamp_epoch(headers: Sequence[tuple[str, bytes]] | None) -> int | None:
    """The layout epoch a record's first header stamps it with (1 or more), or None: the
    record is judged as an unstamped one (no stamp first, or one that names no epoch:
    forged, damaged, or a topic without a layout's 0)."""
    if not headers or headers[0][0] not in (STAMP_HEADER, EPOCH_HEADER):
        return None
    epoch = record_epoch(headers[:1])
    return epoch if epoch is not None and epoch >= 1 else None


def record_epoch(headers: Iterable[tuple[str, bytes]] | None) -> int | None:
    """The layout epoch a record is stamped with, or None (unstamped, or not a stamp)."""
    for k, v in headers or ():
        if k == STAMP_HEADER:
            v = v[TAG_BYTES:] if v and len(v) > TAG_BYTES else b""
        elif k != EPOCH_HEADER:
            continue
        try:
            return int(v) if v and v.isdigit() else None
        except (TypeError, ValueError):
            return None
    return None


def is_copy(headers: Sequence[tuple[str, bytes]] | None) -> bool:
    """Whether a record is a copy for compaction (:data:`COPY_HEADER`), not one to apply."""
    return bool(headers) and headers[0][0] == COPY_HEADER  # type: ignore[index]


def record_producer(headers: Iterable[tuple[str, bytes]] | None) -> str | None:
    """Who stamped a record: the tag that ends its producer's id (or, in an earlier
    stamp, the whole id); None when unstamped."""
    for k, v in headers or ():
        if k == STAMP_HEADER and v and len(v) > TAG_BYTES:
            return v[:TAG_BYTES].decode("ascii", "backslashreplace")
        if k == PRODUCER_HEADER and v:
            return v.decode("utf-8", "backslashreplace")
    return None


def classify_record(
    layout: TopicLayout,
    partition: int,
    offset: int,
    epoch: int | None,
    key_hash: int | None = None,
) -> RecordVerdict:
    """Classify one record by its stamped epoch (see the module docstring)."""
    if offset < layout.base_offset(partition):
        return RecordVerdict(RecordStatus.DEAD, epoch)
    if epoch is None:
        return RecordVerdict(RecordStatus.UNSTAMPED)
    if epoch > layout.epoch:
        return RecordVerdict(RecordStatus.NEWER, epoch)
    n0 = layout.n0
    first_epoch = layout.seals[0].epoch if layout.seals else layout.epoch
    known = epoch >= first_epoch
    writer_active = layout.active_at(epoch)
    if known and partition >= writer_active:
        return RecordVerdict(RecordStatus.MISPLACED, epoch)
    if known and key_hash is not None and lh_bucket(key_hash, n0, writer_active) != partition:
        return RecordVerdict(RecordStatus.MISPLACED, epoch)
    for s in layout.seals:
        if s.epoch <= epoch or s.kind not in (ChangeKind.EXPAND, ChangeKind.SHRINK) or not s.sealed:
            continue
        so = s.seal_offset(partition)
        if so is None or offset < so:
            continue
        moved = True
        if key_hash is not None:
            later = [x.new_active for x in layout.seals if x.epoch > epoch] or [layout.active]
            moved = any(lh_bucket(key_hash, n0, n) != partition for n in later)
        return RecordVerdict(RecordStatus.LATE, epoch, s.epoch, moved)
    return RecordVerdict(RecordStatus.OK, epoch)


def violation_record(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    verdict: RecordVerdict,
    producer: str | None,
    *,
    layout_epoch: int,
    group: str | None = None,
) -> dict[str, Any]:
    """The JSON body of a violation report for a late or misplaced record."""
    return {
        "type": "ordering_violation",
        "status": verdict.status.value,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "key": None if key is None else key.decode("utf-8", "backslashreplace"),
        "producer": producer,
        "record_epoch": verdict.record_epoch,
        "seal_epoch": verdict.seal_epoch,
        "layout_epoch": layout_epoch,
        "moved": verdict.moved,
        "group": group,
    }
