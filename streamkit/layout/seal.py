"""The seal on a forwarded stray's origin and on a copy for compaction: how a worker tells
a record streamkit wrote from one that merely carries the header.

A forwarded stray names the record it copies in :data:`strays.STRAY_HEADER`, and a
receiver drops a second copy of the same origin (``strays.SeenStrays``); a sweep that
finds a copy of a stray does not forward the stray again (``runtime.copies``). Trusted
from anyone, the header makes records disappear: a plain producer's record claiming an
origin already seen is dropped, one claiming a high offset makes the real copies below it
look like duplicates, and a record mirrored from another cluster (MirrorMaker copies
headers) carries that cluster's origins.

So the origin is sealed: the header's value is ``PARTITION:OFFSET:MAC``, the MAC a keyed
BLAKE2b of the topic, the origin and the copy's key and value, under a key every worker
of the cluster shares. The key is the first record of the internal topic
:data:`SEAL_TOPIC` (never compacted nor deleted: the first record by offset wins, so
workers that start together and both write one agree). A copy for compaction
(``stamps.COPY_HEADER``, which consumers skip) is sealed the same way, by the producer
that writes it. A header whose seal does not
verify is not an origin: the record is handled as ordinary input, and said once per
partition. Anyone who may read the internal topics can forge a seal; restrict them with
ACLs as the rest of streamkit's internal topics.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from streamkit.internal_records import Malformed, decode_guarded
from streamkit.kafkaio import FetchedRecord, KafkaIO, KafkaIOError
from streamkit.layout.stamps import COPY_HEADER
from streamkit.layout.strays import STRAY_HEADER

__all__ = ["SEAL_TOPIC", "OriginSeal", "load_seal"]

SEAL_TOPIC = "__streamkit_seal"
SEAL_TOPIC_CONFIGS = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
SEAL_RECORD_KEY = b"origin-seal-key"
KEY_BYTES = 32
MAC_BYTES = 8
ORIGIN, COPY = b"origin", b"copy"
"""What a MAC seals (BLAKE2b's personalisation): a forwarded stray's origin, or a copy for compaction."""


@dataclass(frozen=True)
class OriginSeal:
    """Seals and opens the origin of forwarded strays under one key."""

    key: bytes = field(repr=False)

    @classmethod
    def ephemeral(cls) -> OriginSeal:
        """A key of this process only: for copies no other process has to recognise."""
        return cls(secrets.token_bytes(KEY_BYTES))

    def _mac(
        self, kind: bytes, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None
    ) -> bytes:
        h = hashlib.blake2b(key=self.key, digest_size=MAC_BYTES, person=kind)  # an origin's never opens a copy's
        for part in (topic.encode(), b"%d:%d" % (partition, offset)):
            h.update(b"%d:" % len(part))
            h.update(part)
        for data in (key, value):  # None and b"" differ
            h.update(b"-" if data is None else b"%d:%s" % (len(data), data))
        return h.hexdigest().encode()

    def seal(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None) -> bytes:
        """The header value naming ``topic[partition]@offset`` as the origin of a copy with
        ``key`` and ``value``."""
        return b"%d:%d:%s" % (partition, offset, self._mac(ORIGIN, topic, partition, offset, key, value))

    def seal_copy(self, topic: str, placed: int, key: bytes | None, value: bytes | None) -> bytes:
        """The value of a copy for compaction's first header (``stamps.COPY_HEADER``): the
        partition its original is placed in, sealed with the copy's key and value."""
        return b"%d:%s" % (placed, self._mac(COPY, topic, placed, -1, key, value))

    def copy_of(self, topic: str, record: Any) -> int | None:
        """The partition the original of a copy for compaction lies in, when the record's
        first header is a sealed copy header; None for any other record (a header a
        plain producer wrote, or a mirror copied from another cluster)."""
        headers = record.headers
        if not headers or headers[0][0] != COPY_HEADER:
            return None
        try:
            placed, mac = headers[0][1].split(b":")
            p = int(placed)
        except (ValueError, TypeError, AttributeError):
            return None
        return p if hmac.compare_digest(mac, self._mac(COPY, topic, p, -1, record.key, record.value)) else None

    def origin(self, topic: str, record: Any) -> tuple[int, int] | None:
        """(partition, offset) the copy ``record`` of ``topic`` was forwarded from, when its
        last header is a sealed origin; None for any other record."""
        headers = record.headers
        if not headers or headers[-1][0] != STRAY_HEADER:
            return None
        try:
            partition, offset, mac = headers[-1][1].split(b":")
            p, o = int(partition), int(offset)
        except (ValueError, TypeError, AttributeError):
            return None
        if not hmac.compare_digest(mac, self._mac(ORIGIN, topic, p, o, record.key, record.value)):
            return None
        return p, o


async def load_seal(
    io: KafkaIO, producer: Callable[[], Awaitable[Any]], *, create: bool = True, replication_factor: int = 1
) -> OriginSeal:
    """The cluster's seal: the first well-formed key in :data:`SEAL_TOPIC`, written first
    when there is none (``producer()``: an acks=all producer, asked for only then).
    Without ``create`` and without a key, an :meth:`OriginSeal.ephemeral` one (nothing
    streamkit wrote can be recognised: such a reader, a diagnostic, only labels records)."""
    if await io.partition_count(SEAL_TOPIC) is None:
        if not create:
            return OriginSeal.ephemeral()
        await io.create_topic(SEAL_TOPIC, 1, replication_factor=replication_factor, configs=SEAL_TOPIC_CONFIGS)
    if (found := await _first_key(io)) is not None:
        return found
    if not create:
        return OriginSeal.ephemeral()
    await (await (await producer()).send(SEAL_TOPIC, secrets.token_bytes(KEY_BYTES), key=SEAL_RECORD_KEY, partition=0))
    if (found := await _first_key(io)) is None:
        raise KafkaIOError(f"{SEAL_TOPIC}[0]: the seal key written is not there to read back")
    return found


def _seal_key(record: FetchedRecord) -> bytes:
    if record.key != SEAL_RECORD_KEY:
        raise Malformed(f"not the seal's key: {record.key!r}")
    if record.value is None or len(record.value) != KEY_BYTES:
        raise Malformed(f"a seal key is {KEY_BYTES} bytes, not {None if record.value is None else len(record.value)}")
    return record.value


async def _first_key(io: KafkaIO) -> OriginSeal | None:
    pos = 0
    while True:
        records, end = await io.fetch_at(SEAL_TOPIC, 0, pos, None)
        for r in records:
            if (key := decode_guarded(r, functools.partial(_seal_key, r))) is not None:
                return OriginSeal(key)
        if not records or records[-1].offset + 1 >= end:
            return None
        pos = records[-1].offset + 1
