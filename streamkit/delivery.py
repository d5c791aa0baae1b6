"""The open batches of the streamkit producer and the deliveries it hands out.

A producer keeps one open batch per partition (`OpenBatch`); `Producer.send` appends a
record without awaiting anything and returns a `Delivery`, which follows its record if
a layout change places it again before its batch was handed to the network.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from aiokafka.structs import RecordMetadata, TopicPartition

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import kafka_partition, key_hash_cached
from streamkit.layout.model import TopicLayout
from streamkit.layout.placement import Placer
from streamkit.layout.stamps import stamp

__all__ = ["REPLACED", "Delivery", "OpenBatch", "TopicPlacement", "encode_key", "encode_value"]

Headers = Sequence[tuple[str, bytes]] | None


def encode_key(key: Any) -> bytes | None:
    """A record key as bytes: str as UTF-8, anything else but bytes as JSON."""
    if key is None or isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, (bytearray, memoryview)):
        return bytes(key)
    return orjson.dumps(key)


def encode_value(value: Any) -> bytes | None:
    """A record value as bytes: anything but bytes as JSON."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return orjson.dumps(value)


class TopicPlacement:
    """How the producer places and stamps the records of one topic (at one layout epoch)."""

    __slots__ = ("topic", "layout", "epoch", "place", "headers", "parents")

    def __init__(
        self, topic: str, layout: TopicLayout | None, physical: int | None, tag: bytes, *, compacted: bool = False
    ) -> None:
        self.topic = topic
        self.layout = layout
        self.parents: Callable[[bytes], tuple[int, ...]] | None = None
        """For a compacted topic grown beyond its initial count: the partitions a key's
        record is also written to (``split_from``), else None."""
        if layout is not None:
            self.epoch = layout.epoch
            self.place: Callable[[bytes | None], int] = Placer(layout)
            if compacted and layout.active > layout.n0:
                n0, n = layout.n0, layout.active
                self.parents = lambda key: split_from(key_hash_cached(key), n0, n)
        else:
            self.epoch = 0
            n = physical or 1
            rr = itertools.cycle(range(n))

            def place(key: bytes | None, _n: int = n, _rr: Any = rr) -> int:
                if key is None:
                    return next(_rr)
                try:
                    return key_hash_cached(key) % _n
                except TypeError:
                    return kafka_partition(bytes(key), _n)

            self.place = place
        self.headers = [stamp(tag, self.epoch)]


def split_from(h: int, n0: int, n: int) -> tuple[int, ...]:
    """The partitions a key of hash ``h`` lay in at the counts from ``n0`` up to ``n``
    active partitions, other than where it lies at ``n``: the partitions its partition was
    split from (linear hashing), which may hold its values from before the splits."""
    now = lh_bucket(h, n0, n)
    return tuple(sorted({q for c in range(n0, n) if (q := lh_bucket(h, n0, c)) != now}))


REPLACED = object()


class OpenBatch:
    """An open (then dispatched) batch of one partition; ``future`` resolves with the
    batch's RecordMetadata (base offset) or with ``REPLACED`` if its records were
    placed again after a layout change before it was dispatched."""

    __slots__ = ("topic", "partition", "builder", "records", "created", "epoch", "future")

    def __init__(self, topic: str, partition: int, builder: Any, epoch: int) -> None:
        self.topic = topic
        self.partition = partition
        self.builder = builder
        self.records: list[tuple[bytes | None, bytes | None, Headers, int | None, Delivery]] = []
        self.created = time.monotonic()
        self.epoch = epoch
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()


class Delivery:
    """What :meth:`Producer.send` returns: await it for the record's RecordMetadata.

    Lighter than a future per record (the batch has one future); follows the record
    if it is placed again after a layout change.
    """

    __slots__ = ("_ob", "_rel", "_ts")

    def __init__(self, ob: OpenBatch, rel: int, ts: int | None) -> None:
        self._ob = ob
        self._rel = rel
        self._ts = ts

    @property
    def partition(self) -> int:
        """The partition the record is (currently) placed on."""
        return self._ob.partition

    def done(self) -> bool:
        f = self._ob.future
        return f.done() and (f.cancelled() or f.exception() is not None or f.result() is not REPLACED)

    def _meta(self, ob: OpenBatch, md: Any) -> RecordMetadata:
        tp = TopicPartition(ob.topic, ob.partition)
        ts = self._ts if self._ts is not None else md.timestamp
        return RecordMetadata(
            ob.topic, ob.partition, tp, md.offset + self._rel, ts, md.timestamp_type, md.log_start_offset
        )

    def result(self) -> RecordMetadata:
        ob = self._ob
        md = ob.future.result()
        if md is REPLACED:  # pragma: no cover - the delivery follows its record
            raise asyncio.InvalidStateError("record not delivered yet")
        return self._meta(ob, md)

    def __await__(self) -> Any:
        while True:
            ob = self._ob
            md = yield from ob.future.__await__()
            if md is not REPLACED:
                return self._meta(ob, md)
