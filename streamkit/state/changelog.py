"""A job's changelog: what each checkpoint changed in each processor's store, and markers.

One topic per job (:func:`changelog_topic`), one partition per processor (partition
``i`` is processor ``i``'s; the topic grows with the processors). A checkpoint appends
to each processor's partition the keys its tables changed since its previous checkpoint
(the last value of each; ``None``, a tombstone, for a delete or an expired window), then
a *marker*: the checkpoint itself (input positions, IC ranges, epochs, generation,
extra), the batch it closes, the offsets its records were written at (its *spans*: one
per producer record batch, whose offsets the broker gives in one run) and the changelog
position of the checkpoint the batch builds on (its *base*). The store batch records
the position after the marker (:data:`CHANGELOG_POSITION` in the checkpoint's extra).
A record names nothing itself: the marker's spans say which batch it is of, so another
writer's records (a zombie's) between them are no part of it. Changelogs written before
spans name each record's batch in a header (:data:`BATCH_HEADER`); those are still read.

The markers form a chain through their bases: the lineage of one store. A restore
(``streamkit.state.restore``) follows the chain back from the newest marker of the
newest generation and applies only the batches on it, in order:

- a batch no marker closes (a crash between the changelog write and the store batch,
  or during the write) is not on the chain;
- neither is a batch whose marker a crash left without a store batch: the next
  checkpoint of that store builds on the store's position, before it;
- nor a zombie's (an old owner paused through a rebalance, writing on resume): the new
  owner writes a marker of its newer generation when it takes the processor
  (:meth:`ChangelogWriter.takeover`), so the chain starts from the new owner's markers.

A store with no changelog position (a job that had no changelog, a store built by a
Spark backfill or by a rebuild from the input) writes its whole state once: a
*snapshot* batch, whose marker has no base.

Compaction (``cleanup.policy=compact``) keeps the newest record of each key: markers
have keys of their own (one per batch) and are never compacted away, so the chain
stays whole. A record of a batch off the chain may still shadow an older value of its
key; the restore then applies neither, and the key's next change restores it. (A record
batch that a producer retry wrote twice, the first try handled by the broker after the
second, is such a batch: its copy at the offsets the broker acknowledged is on the chain,
the other not.)
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.producer.message_accumulator import BatchBuilder

from stores.base import Checkpoint
from streamkit.checkpoint_keys import CHANGELOG_POSITION
from streamkit.errors import StreamkitError
from streamkit.internal_records import decode_guarded
from streamkit.kafkaio import CREATE_CONFIGS, CREATE_PARTITIONS_API, KafkaIO

log = logging.getLogger(__name__)


BATCH_HEADER = "sk.batch"
"""The header that named each record's batch in changelogs written before markers held
their spans (read, never written)."""
NO_HEADERS: list[tuple[str, bytes]] = []
MARKER_PREFIX = b"\xffsk.marker2:"
"""Marker keys start with this (change keys start with a table name, never 0xff)."""
HEADED_MARKER_PREFIX = b"\xffsk.marker:"
"""The keys of markers written before spans (whose records name their batch). Markers
with spans have a prefix of their own so that a worker of an earlier version never takes
one for a marker: it would find none of its records (they have no header) and restore an
empty store at the marker's positions; it restores from the last marker it can read, or
from the input, instead."""
MARKER_PREFIXES = (MARKER_PREFIX, HEADED_MARKER_PREFIX)
"""What every reader takes for a marker's key."""
COMPACTED = {"cleanup.policy": "compact", "min.compaction.lag.ms": str(60 * 60 * 1000)}
"""The changelog's topic configs: compaction, and an hour before a record may go (a
restarting owner sees a zombie's records before compaction could act on them)."""

RECORDS_PER_BATCH = 8192
CHANGELOG_BATCH_BYTES = 512 * 1024
"""The changelog producer's batch size: a producer sends one batch per partition at a
time, so a checkpoint of many keys takes a round trip per batch (at aiokafka's default of
16 KiB, about 1.1 µs of each changed key on the test broker; at 512 KiB, 0.3 µs). Below
the 1 MiB a broker takes in one record batch by default."""


def changelog_topic(app: str) -> str:
    return f"__streamkit_changelog_{app}"


class ChangelogFullError(StreamkitError):
    """The job has more processors than its changelog partitions, and the broker cannot
    add partitions."""


def room_message(topic: str, partitions: int, processors: int) -> str:
    return (
        f"the changelog {topic} has {partitions} partitions, fewer than {processors} processors, and this broker "
        f"cannot add partitions (CreatePartitions): add them with the broker's own tools "
        f"(kafka-topics --alter --topic {topic} --partitions {processors}), or give new jobs more with the "
        f"changelog_partitions setting"
    )


@dataclass(frozen=True)
class _Where:
    topic: str
    partition: int
    offset: int


def change_key(table: str, key: bytes) -> bytes:
    return table.encode() + b"\x00" + key


@dataclass(frozen=True)
class Marker:
    """What closes one batch of a processor's changes (see the module docstring)."""

    batch: str
    base: int | None
    """The changelog position the batch builds on (None: a snapshot, the whole state)."""
    generation: int
    checkpoint: Checkpoint
    start: int
    """The offset of the batch's first record (the marker's own offset if it is empty)."""
    spans: tuple[tuple[int, int], ...] | None = None
    """The offsets of the batch's records, ascending ``(first, end)`` pairs (``end``
    excluded); None in a marker written before spans, whose records carry
    :data:`BATCH_HEADER`."""

    def encode(self) -> bytes:
        doc: dict[str, Any] = {
            "batch": self.batch,
            "base": self.base,
            "generation": self.generation,
            "start": self.start,
            "checkpoint": self.checkpoint.to_bytes().decode(),
        }
        if self.spans is not None:
            doc["spans"] = self.spans
        return orjson.dumps(doc)

    @classmethod
    def decode(cls, value: bytes) -> Marker:
        doc = orjson.loads(value)
        spans = doc.get("spans")
        return cls(
            batch=str(doc["batch"]),
            base=None if doc["base"] is None else int(doc["base"]),
            generation=int(doc["generation"]),
            checkpoint=Checkpoint.from_bytes(doc["checkpoint"].encode()),
            start=int(doc["start"]),
            spans=None if spans is None else tuple((int(a), int(b)) for a, b in spans),
        )

    @classmethod
    def of(cls, record: Any, topic: str = "?", partition: int = -1) -> Marker | None:
        """The marker ``record`` (under a marker key) holds; None when it does not decode,
        or has the wrong shape (a record streamkit did not write): then it is skipped,
        counted and logged once as ``topic[partition]@offset``
        (``streamkit.internal_records``)."""
        where = _Where(getattr(record, "topic", topic), getattr(record, "partition", partition), record.offset)
        return decode_guarded(where, partial(cls.decode, record.value))

    def split(self, records: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """``records`` (in offset order) as this batch's and the others."""
        mine: list[Any] = []
        others: list[Any] = []
        if self.spans is None:
            batch = self.batch.encode()
            for r in records:
                (mine if named_batch(r.headers) == batch else others).append(r)
            return mine, others
        spans, at = self.spans, 0
        for r in records:
            while at < len(spans) and spans[at][1] <= r.offset:
                at += 1
            (mine if at < len(spans) and spans[at][0] <= r.offset else others).append(r)
        return mine, others


def named_batch(headers: Any) -> bytes | None:
    """The batch a record written before markers held spans names in its header."""
    if headers and headers[0][0] == BATCH_HEADER:
        return bytes(headers[0][1])
    return next((bytes(v) for k, v in (headers or ()) if k == BATCH_HEADER), None)


Change = tuple[bytes, "bytes | None"]
"""A changelog record's key (``change_key``) and value (None: a tombstone)."""


def snapshot_changes(store: Any, caches: Mapping[str, Any]) -> Iterator[Change]:
    """Every committed key of the tables in ``store`` that their ``caches`` did not
    change since (:func:`teed_changes` gives those): with them, a snapshot batch."""
    for table, cache in caches.items():
        changed = set(cache.changes())
        for key, value in store.items(table):
            if key not in changed:
                yield change_key(table, key), value


class ChangelogRecords:
    """One batch of a processor's changes as producer record batches of
    ``RECORDS_PER_BATCH`` records at most.

    Records go straight into aiokafka's record batch builder (``_builder``, with the
    batch's ``_relative_offset`` kept): its ``BatchBuilder.append`` wrapper costs a
    quarter of a microsecond per record, which at a million keys is a tenth of the
    changelog's cost. A key comes once in a batch: the producer batches may go in any
    order."""

    def __init__(self, producer: AIOKafkaProducer, batch: str) -> None:
        self.producer = producer
        self.batch = batch
        self.count = 0
        self._full: list[BatchBuilder] = []
        self.sizes: list[int] = []
        """The records of each sealed record batch (:meth:`builders`), in order."""
        self._open = producer.create_batch()
        self._append = self._open._builder.append
        self._offset = 0

    def add(self, key: bytes, value: bytes | None) -> None:
        if self._offset >= RECORDS_PER_BATCH or self._append(self._offset, None, key, value, NO_HEADERS) is None:
            self._seal()
            self._append(0, None, key, value, NO_HEADERS)  # an empty batch takes any record
        self._offset += 1
        self.count += 1

    def _seal(self) -> None:
        self._open._relative_offset = self._offset
        self._full.append(self._open)
        self.sizes.append(self._offset)
        self._open = self.producer.create_batch()
        self._append, self._offset = self._open._builder.append, 0

    def builders(self) -> list[BatchBuilder]:
        """Every record batch, to send in order (none after this)."""
        if self._offset:
            self._seal()
        return self._full


class Teed(Mapping[bytes, "bytes | None"]):
    """A table's pending changes (``stores.cache.PendingChanges``) as a store batch reads
    them (``write_to``, or ``items``), each change also handed to ``add`` with the
    table's changelog key: serialised once, for the store and the changelog both. Read
    once: each read hands every change to ``add`` again."""

    def __init__(self, pending: Any, prefix: bytes, add: Callable[[bytes, bytes | None], None]) -> None:
        self.pending, self.prefix, self.add = pending, prefix, add

    def __len__(self) -> int:
        return len(self.pending)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.pending)

    def __getitem__(self, key: bytes) -> bytes | None:
        return self.pending[key]

    def items(self) -> Iterator[tuple[bytes, bytes | None]]:  # type: ignore[override]
        for key, value in self.pending.items():
            self.add(self.prefix + key, value)
            yield key, value

    def write_to(self, put: Callable[[bytes, bytes, Any], None], delete: Callable[[bytes, Any], None], cf: Any) -> None:
        self.pending.write_to(put, delete, cf, self.add, self.prefix)


def teed_changes(caches: Mapping[str, Any], add: Callable[[bytes, bytes | None], None]) -> dict[str, Teed]:
    """Per table, its cache's pending changes teed into ``add`` (a store's ``prepare``)."""
    return {table: Teed(cache.changes(), change_key(table, b""), add) for table, cache in caches.items()}


class ChangelogWriter:
    """Appends batches and markers to a job's changelog (one producer, acks=all)."""

    def __init__(self, producer: AIOKafkaProducer, io: KafkaIO, topic: str) -> None:
        self.producer = producer
        self.io = io
        self.topic = topic
        self.writer = uuid.uuid4().hex[:12]
        self._seq = 0
        self._partitions = 0
        self.records_written = 0

    async def ensure(self, processors: int, create: int = 0) -> None:
        """The topic exists with a partition for each of ``processors`` processors (it
        grows with the job where the broker can add partitions; created compacted where
        the broker takes the setting, with ``create`` partitions if more)."""
        if processors <= self._partitions:
            return
        count = await self.io.partition_count(self.topic)
        if count is None:
            size = max(processors, create)
            try:
                await self.io.create_topic(self.topic, size, configs={**CREATE_CONFIGS, **COMPACTED})
            except Exception as exc:  # noqa: BLE001 - a broker without compaction settings
                log.warning("%s: created without %s (%s)", self.topic, COMPACTED, exc)
                await self.io.create_topic(self.topic, size)
            count = await self.io.partition_count(self.topic)
        if count is not None and count < processors:
            if not await self.io.supports_api(CREATE_PARTITIONS_API):
                raise ChangelogFullError(room_message(self.topic, count, processors))
            try:
                await self.io.create_partitions(self.topic, processors)
            except Exception:  # noqa: BLE001 - another worker grew it first
                if ((await self.io.partition_count(self.topic)) or 0) < processors:
                    raise
            count = processors
        self._partitions = count or 0

    def records(self) -> ChangelogRecords:
        """A new batch of changes, to fill (:meth:`ChangelogRecords.add`) and :meth:`send`."""
        self._seq += 1
        return ChangelogRecords(self.producer, f"{self.writer}-{self._seq}")

    async def write(
        self,
        partition: int,
        changes: Iterable[Change],
        checkpoint: Checkpoint,
        *,
        base: int | None,
        generation: int | None = None,
    ) -> int:
        """Write one batch of ``changes`` and its marker to ``partition``; the changelog
        position after the marker (what the store batch records)."""
        records = self.records()
        for key, value in changes:
            records.add(key, value)
        return await self.send(partition, records, checkpoint, base=base, generation=generation)

    async def send(
        self,
        partition: int,
        records: ChangelogRecords,
        checkpoint: Checkpoint,
        *,
        base: int | None,
        generation: int | None = None,
    ) -> int:
        """Send ``records`` to ``partition`` and, once every one is acknowledged, the marker
        closing them; the changelog position after the marker. ``generation``: the
        marker's (default: the checkpoint's)."""
        await self.ensure(partition + 1)
        sent = [await self.producer.send_batch(b, self.topic, partition=partition) for b in records.builders()]
        firsts = [int((await fut).offset) for fut in sent]  # every record acknowledged, each batch's first offset
        if any(first < 0 for first in firsts):  # (a duplicate an idempotent producer's broker refused has none)
            raise StreamkitError(f"{self.topic}[{partition}]: a record batch was acknowledged without its offset")
        spans = tuple(sorted((first, first + size) for first, size in zip(firsts, records.sizes, strict=True)))
        marker_key = MARKER_PREFIX + records.batch.encode()
        # the marker's start is known only for a non-empty batch before it is sent
        gen = checkpoint.generation if generation is None else generation
        marker = Marker(records.batch, base, gen, checkpoint, spans[0][0] if spans else -1, spans)
        meta = await self.producer.send_and_wait(self.topic, marker.encode(), key=marker_key, partition=partition)
        self.records_written += records.count + 1
        return int(meta.offset) + 1

    async def takeover(self, partition: int, checkpoint: Checkpoint) -> Checkpoint:
        """Write an empty batch of ``checkpoint``'s generation, building on the store's
        changelog position: a member does when it takes the processor, so that a zombie's
        later markers (an older generation) are not the chain's head. Returns the
        checkpoint the store's next one builds on: at the position after this marker (so
        that the chain runs through it, and a standby that applied it goes on), or, when
        records other than markers lie beyond the store's position (another store's, or a
        zombie's, changes: their keys may shadow the store's values once compacted),
        without a position: its next checkpoint is then a snapshot."""
        base = position_of(checkpoint)
        assert base is not None
        await self.ensure(partition + 1)
        tail, _ = await self.io.read(self.topic, partition, base)
        after = await self.write(partition, (), checkpoint, base=base)
        if not all(r.key is not None and r.key.startswith(MARKER_PREFIXES) for r in tail):
            return unlogged(checkpoint)
        return checkpoint.replace(extra={**checkpoint.extra, CHANGELOG_POSITION: after})

    async def later_owner(self, partition: int, checkpoint: Checkpoint) -> Marker | None:
        """The first marker beyond a store's changelog position (``checkpoint``'s) that a
        later owner of the processor wrote (a newer generation than the store's) for a
        checkpoint elsewhere in the input than the store (its positions or IC ranges), or
        with changes (a timer's, a wall-clock close's): that owner may have sent output and
        sink rows the store knows nothing of, so the store must not be taken as it is (None:
        no such marker; a zombie's, of an older generation, does not count, nor a later
        owner's takeover of this very state, an empty batch at the same positions)."""
        base = position_of(checkpoint)
        assert base is not None
        tail, _ = await self.io.read(self.topic, partition, base)
        for r in tail:
            if r.key is None or not r.key.startswith(MARKER_PREFIXES):
                continue
            marker = Marker.of(r, self.topic, partition)
            if marker is not None and marker.generation > checkpoint.generation:
                theirs = marker.checkpoint  # (and a batch of changes: a timer's)
                changed = bool(marker.spans) if marker.spans is not None else marker.start not in (-1, r.offset)
                if changed or theirs.positions != checkpoint.positions or theirs.ic_ranges != checkpoint.ic_ranges:
                    return marker
        return None


def position_of(checkpoint: Checkpoint) -> int | None:
    """The changelog position a store's checkpoint matches (None: not in the changelog)."""
    pos = checkpoint.extra.get(CHANGELOG_POSITION)
    return None if pos is None else int(pos)


def unlogged(checkpoint: Checkpoint) -> Checkpoint:
    """``checkpoint`` without its changelog position: the store's next checkpoint writes
    its whole state (a store written past the changelog, or whose lineage was broken)."""
    return checkpoint.replace(extra={k: v for k, v in checkpoint.extra.items() if k != CHANGELOG_POSITION})
