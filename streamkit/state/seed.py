"""Stores built outside the workers (a Spark backfill) written to the job's changelog
before any processor serves them (each is held open while it goes in: a worker waits).

Each store goes in whole, as a snapshot batch, and its checkpoint then records the
changelog position after the snapshot's marker: from then on the store is in the
changelog like any other (a lost disk restores it; its processor's checkpoints build on
it). The marker takes the newest generation already in the partition, so that it is the
chain's head over anything an earlier life of the job wrote there (a restore follows the
newest marker of the newest generation); the worker that takes the processor writes its
own, newer, marker on it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path

from aiokafka import AIOKafkaProducer

from stores.base import Store, StoreLockedError
from stores.rocksdb import RocksDBStore
from streamkit.connection import Connection
from streamkit.kafkaio import ACKED_HOLE_WAIT, KafkaIO
from streamkit.state.changelog import (
    CHANGELOG_BATCH_BYTES,
    CHANGELOG_POSITION,
    MARKER_PREFIXES,
    Change,
    ChangelogWriter,
    Marker,
    change_key,
)
from streamkit.state.restore import INCARNATION_KEY

__all__ = ["log_stores"]

log = logging.getLogger(__name__)


async def log_stores(
    connection: Connection, topic: str, stores: Mapping[int, Path], *, processors: int, create: int
) -> dict[int, int]:
    """Write each store of ``stores`` (per processor, a closed store's path) to ``topic``
    as a snapshot and record the position in the store; the positions. ``processors``:
    the job's count (the topic gets a partition for each, ``create`` if it is new)."""
    positions: dict[int, int] = {}
    async with KafkaIO(connection) as io:
        producer = AIOKafkaProducer(
            **connection.client_kwargs(),
            acks="all",
            linger_ms=0,
            max_batch_size=CHANGELOG_BATCH_BYTES,
            max_request_size=2 * CHANGELOG_BATCH_BYTES,
        )
        await producer.start()
        try:
            writer = ChangelogWriter(producer, io, topic)
            await writer.ensure(processors, create=create)
            for pid, path in sorted(stores.items()):
                try:
                    store = RocksDBStore.open(str(path), create=False)
                except StoreLockedError:  # a worker serves it already: its first checkpoint writes it
                    log.warning("store %s is held by a worker: its first checkpoint writes it to %s", path, topic)
                    continue
                with store:  # the processor count its key set is for, as a worker's markers say
                    checkpoint = store.checkpoint()
                    checkpoint = checkpoint.replace(extra={**checkpoint.extra, "p": processors})
                    incarnation = str(checkpoint.extra.get(INCARNATION_KEY, ""))
                    generation = max(await newest_generation(io, topic, pid, incarnation), checkpoint.generation)
                    position = await writer.write(pid, whole_state(store), checkpoint, base=None, generation=generation)
                    store.commit({}, checkpoint.replace(extra={**checkpoint.extra, CHANGELOG_POSITION: position}))
                positions[pid] = position
        finally:
            await producer.stop()
    log.info("stores of processors %s written to %s: positions %s", sorted(stores), topic, positions)
    return positions


def whole_state(store: Store) -> Iterator[Change]:
    """Every key of every table of ``store``, as changelog records."""
    for table in store.tables:
        for key, value in store.items(table):
            yield change_key(table, key), value


async def newest_generation(io: KafkaIO, topic: str, partition: int, incarnation: str = "") -> int:
    """The newest generation of the markers of the job's ``incarnation`` in
    ``topic[partition]`` (-1: none; markers of an earlier incarnation are not the job's,
    as a restore sees them)."""
    if partition >= ((await io.partition_count(topic)) or 0):
        return -1
    records, _ = await io.read(topic, partition, 0, hole_wait=ACKED_HOLE_WAIT)  # (markers: acknowledged)
    markers = [m for r in records if r.key and r.key.startswith(MARKER_PREFIXES) and (m := Marker.of(r)) is not None]
    theirs = [
        m for m in markers if not incarnation or str(m.checkpoint.extra.get(INCARNATION_KEY, "")) in ("", incarnation)
    ]
    return max((m.generation for m in theirs), default=-1)
