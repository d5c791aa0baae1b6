"""The reads of :class:`streamkit.kafkaio.KafkaIO`: fetches with holes asked for again,
reads to a high watermark, whole topics.

Written for the behaviours of the reference broker (see ``docs/architecture.md``):

- A short fetch answer is not the end: :meth:`KafkaReads.read` reads to a high watermark.
- Holes in an answer are asked for again before they are believed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka.errors import for_code
from aiokafka.record.memory_records import MemoryRecords

from streamkit.errors import TopicNotFoundError
from streamkit.kafkaio.base import KafkaIOBase, KafkaIOError
from streamkit.layout.stamps import NO_HEADERS, batch_stamp

__all__ = [
    "ACKED_HOLE_WAIT",
    "HOLE_CONFIRM_FETCHES",
    "HOLE_CONFIRM_SECONDS",
    "FetchedRecord",
    "KafkaReads",
]


@dataclass(frozen=True, slots=True)
class FetchedRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


log = logging.getLogger("streamkit.kafkaio.client")  # the name its warnings have always had

EMPTY_FETCH_WAITS_MS = (1, 20, 50, 100, 200, 500)
"""The fetch wait of each try at records known to be there (the last one repeats)."""
LONG_READ_RECORDS = 500
"""A read of more records than this skips the first (1 ms) fetch wait. Tansu answers a
fetch as soon as it has records, with what it gathered by then: a 1 ms wait brought about
1,000 small-batch records per answer, a 20 ms one 20,000 (measured), at no cost to a short
read; a wait at the end of a log is spent whole, so short reads keep the 1 ms one."""
EMPTY_FETCH_SECONDS = 30.0
"""How long records known to be there may stay out of every answer before a read fails."""

HOLE_CONFIRM_SECONDS = 1.0
"""A hole in a fetch answer still there this long after it was first seen (and after
``HOLE_CONFIRM_FETCHES`` fetches) is real. Tansu's memory engine hands out a batch's
offsets before it writes the batch, so a later batch can be seen first; on a loaded
machine the earlier one took longer than the 10 ms this used to be, and a worker read
past a record that was only late (one record lost in a full test run)."""

HOLE_CONFIRM_FETCHES = 3
"""Fetches that must all miss a hole before it is read past."""

HOLE_PAUSES = (0.0, 0.05, 0.2, 0.75)
"""Pauses before :meth:`KafkaIO.fetch` asks for a hole again (the last answer decides), as
shares of its ``hole_wait``."""

ACKED_HOLE_WAIT = 0.01
"""``hole_wait`` for a log read only below a record its writer saw acknowledged after the
rest (a changelog up to a marker): every batch there was written, so a hole is real
(compaction, which on a changelog leaves many)."""


class KafkaReads(KafkaIOBase):
    """Fetches and reads (:class:`streamkit.kafkaio.KafkaIO` is one)."""

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_wait_ms: int = 1,
        max_bytes: int = 1 << 20,
        hole_wait: float = HOLE_CONFIRM_SECONDS,
    ) -> tuple[list[FetchedRecord], int]:
        """Records at ``>= offset`` (one response's worth) and the high watermark (-1 if unknown).

        One response's worth may be anything down to nothing: Tansu answers with what it
        gathered within ``max_wait_ms``.  To read to the end use :meth:`read`.

        Holes are checked: Tansu (memory engine) sometimes leaves batches out of an answer
        while producers write the partition, and they are there when asked again.  An
        answer is cut at a hole, which is asked for again after each of ``HOLE_PAUSES``
        (``hole_wait`` in all); a hole still there then is real (compaction) and read
        past, with a warning."""
        out, hole, hw = await self._fetch_checked(topic, partition, offset, max_wait_ms, max_bytes, None)
        for i, pause in enumerate(HOLE_PAUSES):
            if hole is None:
                break
            if pause:
                await asyncio.sleep(pause * hole_wait)
            last = i == len(HOLE_PAUSES) - 1
            real = hole if last else None
            more, hole_next, hw2 = await self._fetch_checked(topic, partition, hole, 1, max_bytes, real)
            hw = max(hw, hw2)
            if not more and hole_next == hole:
                continue  # still there: ask again, the last time reading past it
            if last and (not more or more[0].offset != hole) and hole_wait >= HOLE_CONFIRM_SECONDS:
                log.warning(
                    "%s[%d]: offset %d missing from every answer: a real hole, read past", topic, partition, hole
                )
            out.extend(more)
            break
        return out, hw

    async def _fetch_checked(
        self, topic: str, partition: int, offset: int, max_wait_ms: int, max_bytes: int, real_hole: int | None
    ) -> tuple[list[FetchedRecord], int | None, int]:
        """(records at ``>= offset`` before the first hole, where that hole starts or None,
        the high watermark); a hole starting at ``real_hole`` is read past."""
        err, hw, data = await self._fetch_raw(topic, partition, offset, max_wait_ms=max_wait_ms, max_bytes=max_bytes)
        if err:
            raise KafkaIOError(f"fetch {topic}[{partition}]@{offset}: {for_code(err).__name__}")
        out: list[FetchedRecord] = []
        if not data:
            return out, None, hw
        expected = offset
        mr = MemoryRecords(data)
        while mr.has_next():
            batch = mr.next_batch()
            if batch is None:
                break
            if batch.base_offset > expected and expected != real_hole:
                return out, expected, hw
            expected = max(expected, batch.next_offset)
            if batch.is_control_batch:
                continue
            base, inherited = batch.base_offset, NO_HEADERS
            for r in batch:
                headers = r.headers
                if r.offset == base:
                    inherited = batch_stamp(headers)  # the stamp is written once per batch
                if r.offset >= offset:
                    out.append(
                        FetchedRecord(
                            topic, partition, r.offset, r.timestamp, r.key, r.value,
                            tuple(headers) if headers else inherited,
                        )
                    )  # fmt: skip
        return out, None, hw

    async def fetch_at(
        self, topic: str, partition: int, pos: int, stop: int | None, *, max_bytes: int = 1 << 20,
        hole_wait: float = HOLE_CONFIRM_SECONDS,
    ) -> tuple[list[FetchedRecord], int]:  # fmt: skip
        """Records at ``>= pos`` (at least one, unless ``pos`` is at ``stop``, or with ``stop``
        None at the high watermark) and the high watermark. Tansu answers with what it gathered
        within the fetch's wait, which on a loaded machine is often nothing: an empty answer
        is asked again with a longer wait (``EMPTY_FETCH_WAITS_MS``), for up to
        ``EMPTY_FETCH_SECONDS`` before :class:`KafkaIOError` names the missing records."""
        deadline: float | None = None
        first = 1 if stop is not None and stop - pos > LONG_READ_RECORDS else 0
        for attempt in itertools.count(first):
            wait = EMPTY_FETCH_WAITS_MS[min(attempt, len(EMPTY_FETCH_WAITS_MS) - 1)]
            recs, hw = await self.fetch(
                topic, partition, pos, max_bytes=max_bytes, max_wait_ms=wait, hole_wait=hole_wait
            )
            known_end = stop if stop is not None else hw if hw >= 0 else None
            if recs or (known_end is not None and known_end <= pos):
                return recs, hw
            now = time.monotonic()
            deadline = deadline or now + EMPTY_FETCH_SECONDS
            if now > deadline:
                raise KafkaIOError(
                    f"{topic}[{partition}]: no records between offsets {pos} and "
                    f"{known_end if known_end is not None else '(high watermark unknown)'} "
                    f"in {EMPTY_FETCH_SECONDS:g} s of fetches"
                )
        raise AssertionError("unreachable")

    async def read(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int | None = None,
        *,
        max_bytes: int = 1 << 20,
        hole_wait: float = HOLE_CONFIRM_SECONDS,
    ) -> tuple[list[FetchedRecord], int]:
        """Records in ``[start, end)`` and ``end``; with ``end`` None, up to the high
        watermark of the first fetch response (returned as the end; it may be below
        ``start`` if the log was truncated). ``hole_wait``: as :meth:`fetch`'s."""
        out: list[FetchedRecord] = []
        pos, stop = start, end
        while stop is None or pos < stop:
            recs, hw = await self.fetch_at(topic, partition, pos, stop, max_bytes=max_bytes, hole_wait=hole_wait)
            if stop is None and hw >= 0:
                stop = hw
            if not recs:
                break
            out.extend(r for r in recs if stop is None or r.offset < stop)
            pos = recs[-1].offset + 1
        return out, (pos if stop is None else stop)

    async def first_offset_at_or_after(self, topic: str, partition: int, ts_ms: int, hw: int) -> int:
        """Smallest offset whose record timestamp is >= ``ts_ms`` (binary search by fetches;
        timestamps are assumed roughly increasing).  ``hw`` if none."""
        lo, hi = 0, hw
        while lo < hi:
            mid = (lo + hi) // 2
            recs, _ = await self.fetch(topic, partition, mid, max_bytes=1024)
            if not recs:
                hi = mid
                continue
            r = recs[0]
            if r.timestamp >= ts_ms:
                hi = mid
            else:
                lo = max(mid + 1, r.offset + 1)
        return lo

    async def read_topic(self, topic: str, partitions: Iterable[int] | None = None) -> list[FetchedRecord]:
        """Every record of ``topic`` (or of ``partitions``) up to each partition's high
        watermark, partition by partition in offset order (holes asked for again)."""
        if partitions is None:
            n = await self.partition_count(topic)
            if n is None:
                raise TopicNotFoundError(f"topic {topic!r} does not exist")
            partitions = range(n)
        out: list[FetchedRecord] = []
        for p in sorted(partitions):
            recs, _ = await self.read(topic, p, 0)
            out.extend(recs)
        return out
