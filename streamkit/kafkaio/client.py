"""streamkit's one Kafka I/O client: raw fetches (records + high watermark), topic admin.

Everything streamkit reads outside the group consumers goes through :class:`KafkaIO`:
the layout registry and the acks log, the progress log, worker heartbeats, the job
record, ``status``, ``topics`` and ``streamkit.testing``.  It is written for the
behaviours of the reference broker (see ``docs/architecture.md``):

- High watermarks come from *fetch* responses: the reference broker answers
  ListOffsets wrongly when the last batch holds several records.  A fetch far beyond
  the log end returns the high watermark without data there; on brokers that answer
  it with OFFSET_OUT_OF_RANGE (Apache Kafka), ListOffsets is right and is used.
- A short fetch answer is not the end: :meth:`KafkaIO.read` reads to a high watermark.
- Holes in an answer are asked for again before they are believed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaClient
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.errors import (
    KafkaConnectionError,
    NodeNotReadyError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    for_code,
)
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.protocol.offset import OffsetRequest
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from streamkit.connection import Connection, as_connection, connect_failure, quiet_bootstrap
from streamkit.errors import StreamkitError, TopicNotFoundError
from streamkit.layout.stamps import NO_HEADERS, batch_stamp

__all__ = [
    "ACKED_HOLE_WAIT",
    "CREATE_CONFIGS",
    "HOLE_CONFIRM_FETCHES",
    "HOLE_CONFIRM_SECONDS",
    "FetchedRecord",
    "KafkaIO",
    "KafkaIOError",
]

_BEYOND = 1 << 62
CREATE_PARTITIONS_API = 37


class KafkaIOError(StreamkitError):
    """The broker could not be reached or refused a request; the message says which."""


CREATE_CONFIGS: dict[str, str] = {"retention.ms": "604800000", "retention.bytes": "-1"}
"""Set at creation so that DescribeConfigs reports them: the reference broker's
DescribeConfigs returns only configs given at creation, and peers (quixstreams:
KeyError 'retention.ms') need these."""


@dataclass(frozen=True, slots=True)
class FetchedRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


log = logging.getLogger(__name__)

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


class KafkaIO:
    """One low-level client for raw fetches, plus an admin client made on demand."""

    def __init__(self, broker: str | Connection, *, client_id: str = "streamkit", request_timeout_ms: int = 10_000):
        self.connection = as_connection(broker)
        self.bootstrap = self.connection.bootstrap
        self._client_id = client_id
        self._timeout_ms = request_timeout_ms
        self._client: AIOKafkaClient | None = None
        self._admin: AIOKafkaAdminClient | None = None

    async def start(self) -> KafkaIO:
        if self._client is None:
            client = AIOKafkaClient(
                **self.connection.client_kwargs(), client_id=self._client_id, request_timeout_ms=self._timeout_ms
            )
            try:
                with quiet_bootstrap():  # its cause is reported once, by connect_failure
                    await client.bootstrap()
            except Exception:  # noqa: BLE001 - a rejected SCRAM login is a KeyError in aiokafka
                await client.close()
                raise await connect_failure(self.connection) from None
            self._client = client
        return self

    async def close(self) -> None:
        if self._admin is not None:
            await self._admin.close()
            self._admin = None
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def __aenter__(self) -> KafkaIO:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def client(self) -> AIOKafkaClient:
        if self._client is None:
            raise KafkaIOError("KafkaIO not started")
        return self._client

    async def admin(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            admin = AIOKafkaAdminClient(
                **self.connection.client_kwargs(), request_timeout_ms=self._timeout_ms, client_id=self._client_id
            )
            try:
                with quiet_bootstrap():
                    await admin.start()
            except Exception:  # noqa: BLE001 - as in start()
                await admin.close()
                raise await connect_failure(self.connection) from None
            self._admin = admin
        return self._admin

    # ------------------------------------------------------------------ metadata

    async def partition_count(self, topic: str, *, refresh: bool = True) -> int | None:
        """Physical partitions of ``topic`` (None if it does not exist).

        Asks with ``allow_auto_topic_creation=False``: brokers that auto-create topics
        on metadata requests (Tansu does) must not create it by being asked.
        """
        c = self.client
        for attempt in range(3):
            node = c.get_random_node()
            if node is None:
                await c.force_metadata_update()
                node = c.get_random_node()
            try:
                resp = await c.send(node, MetadataRequest([topic], False))
            except (NodeNotReadyError, RequestTimedOutError, KafkaConnectionError) as exc:
                if attempt == 2:
                    raise KafkaIOError(f"metadata request failed: {exc}") from None
                await asyncio.sleep(0.05)
                continue
            for t in resp.topics:
                err, name = t[0], t[1]
                parts = next((x for x in t[2:] if isinstance(x, list)), [])
                if name == topic:
                    if err == 0 and parts:
                        return len(parts)
                    if err in (0, 3):  # 3: UNKNOWN_TOPIC_OR_PARTITION
                        return None
                    if attempt == 2:
                        raise KafkaIOError(f"metadata of {topic}: {for_code(err).__name__}")
            await asyncio.sleep(0.05)
        return None

    async def _leader(self, tp: TopicPartition, timeout: float = 10.0) -> int:
        c = self.client
        deadline = time.monotonic() + timeout
        c.add_topic(tp.topic)
        while True:
            leader = c.cluster.leader_for_partition(tp)
            if leader is not None and leader >= 0:
                return leader
            if time.monotonic() > deadline:
                raise KafkaIOError(f"no leader for {tp.topic}[{tp.partition}] (does the topic exist?)")
            await c.force_metadata_update()
            if c.cluster.leader_for_partition(tp) is None:
                await asyncio.sleep(0.05)

    async def supports_api(self, api_key: int) -> bool:
        c = self.client
        node = next(iter(b.nodeId for b in c.cluster.brokers()), None)
        if node is None:
            await c.force_metadata_update()
            node = next(iter(b.nodeId for b in c.cluster.brokers()), None)
        if node is None:
            return False
        conn = await c._get_conn(node)  # noqa: SLF001 - aiokafka keeps ApiVersions on the connection
        versions = getattr(conn, "_versions", None) or {}
        return api_key in versions

    # ------------------------------------------------------------------ fetch

    async def _fetch_raw(
        self, topic: str, partition: int, offset: int, *, max_wait_ms: int, max_bytes: int
    ) -> tuple[int, int, bytes | None]:
        tp = TopicPartition(topic, partition)
        for attempt in range(4):
            node = await self._leader(tp)
            req = FetchRequest(max(1, max_wait_ms), 1, max_bytes, 0, [(topic, [(partition, offset, max_bytes)])])
            try:
                resp = await self.client.send(node, req)
            except (NodeNotReadyError, RequestTimedOutError, KafkaConnectionError) as exc:
                if attempt == 3:
                    raise KafkaIOError(f"fetch {topic}[{partition}] failed: {exc}") from None
                self.client.force_metadata_update()
                await asyncio.sleep(0.05 * (attempt + 1))
                continue
            for _t, parts in resp.topics:
                for p, err, hw, *data in parts:
                    if p == partition:
                        return err, hw, data[-1]
            # Tansu answers an immediate empty response when nothing is there yet.
            return 0, -1, None
        raise AssertionError("unreachable")

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

    async def high_watermark(self, topic: str, partition: int) -> int:
        """The partition's high watermark, from a fetch response.

        A fetch far beyond the end answers it without data on Tansu.  Brokers that
        answer such a fetch with OFFSET_OUT_OF_RANGE (Apache Kafka) implement
        ListOffsets correctly, which is then used.
        """
        for _ in range(5):  # an answer without the partition (hw -1) is asked again
            err, hw, _ = await self._fetch_raw(topic, partition, _BEYOND, max_wait_ms=1, max_bytes=64)
            if err == 0 and hw >= 0:
                return hw
            if err:
                break
        tp = TopicPartition(topic, partition)
        node = await self._leader(tp)
        resp = await self.client.send(node, OffsetRequest(-1, 0, [(topic, [(partition, -1)])]))
        for _t, parts in resp.topics:
            for part in parts:
                if part[0] == partition and part[1] == 0:
                    return int(part[-1] if len(part) <= 4 else part[3])
        raise KafkaIOError(f"cannot read the high watermark of {topic}[{partition}]: {for_code(err).__name__}")

    async def log_start_offsets(self, topic: str, partitions: Iterable[int]) -> dict[int, int]:
        """Each partition's log start offset (ListOffsets, earliest): records below it are
        gone (retention, deleted records)."""
        out: dict[int, int] = {}
        for partition in sorted(set(partitions)):
            node = await self._leader(TopicPartition(topic, partition))
            resp = await self.client.send(node, OffsetRequest(-1, 0, [(topic, [(partition, -2)])]))
            for _t, parts in resp.topics:
                for part in parts:
                    if part[0] == partition:
                        if part[1] != 0:
                            raise KafkaIOError(
                                f"cannot read the log start offset of {topic}[{partition}]: "
                                f"{for_code(part[1]).__name__}"
                            )
                        out[partition] = int(part[-1] if len(part) <= 4 else part[3])
        return out

    async def high_watermarks(self, topic: str, partitions: Iterable[int]) -> dict[int, int]:
        parts = sorted(set(partitions))
        hws = await asyncio.gather(*(self.high_watermark(topic, p) for p in parts))
        return dict(zip(parts, hws))

    async def topic_ends(self, topic: str) -> dict[int, int]:
        """The high watermark of every partition of ``topic`` (none if it does not exist)."""
        count = await self.partition_count(topic, refresh=False)
        return await self.high_watermarks(topic, range(count or 0))

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

    # ------------------------------------------------------------------ admin

    async def create_topic(
        self,
        topic: str,
        partitions: int,
        *,
        replication_factor: int = 1,
        configs: Mapping[str, str] = CREATE_CONFIGS,
        timeout: float = 10.0,
        exist_ok: bool = True,
    ) -> bool:
        """Create ``topic`` with ``configs`` set at creation; wait until the broker shows it.

        Returns False if it existed already (``TopicAlreadyExistsError`` without
        ``exist_ok``); any other error of the answer is raised (aiokafka returns
        per-topic errors instead of raising them).  A topic this call created is waited
        for until its metadata shows all ``partitions``.
        """
        admin = await self.admin()
        created = True
        try:
            response = await admin.create_topics(
                [NewTopic(topic, partitions, replication_factor, topic_configs=dict(configs))],
                timeout_ms=int(timeout * 1000),
            )
        except TopicAlreadyExistsError:
            created = False
        else:
            for topic_error in response.topic_errors:
                code, message = topic_error[1], topic_error[2] if len(topic_error) > 2 else None
                if code == TopicAlreadyExistsError.errno:
                    created = False
                elif code:
                    error = for_code(code)
                    raise error(f"create topic {topic!r}: {message or error.__name__}")
        if not created and not exist_ok:
            raise TopicAlreadyExistsError(f"topic {topic!r} already exists")
        deadline = time.monotonic() + timeout
        while True:
            count = await self.partition_count(topic)
            if count is not None and (not created or count >= partitions):
                return created
            if time.monotonic() > deadline:
                raise KafkaIOError(f"topic {topic} did not appear with {partitions} partitions within {timeout} s")
            await asyncio.sleep(0.02)

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        """Physical partition count per topic; ``TopicNotFoundError`` names a missing one."""
        counts: dict[str, int] = {}
        for name in topics:
            n = await self.partition_count(name)
            if n is None:
                raise TopicNotFoundError(
                    f"topic {name!r} does not exist (create it: streamkit topics create {name} --partitions N)"
                )
            counts[name] = n
        return counts

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

    async def topic_configs(self, topic: str) -> dict[str, str]:
        """``topic``'s configs as the broker describes them (the reference broker: only
        those set at creation)."""
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        admin = await self.admin()
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        # each resource: (error code, error message, type, name, [(name, value, ...), ...])
        for r in responses:
            for res in r.resources:
                if res[0]:
                    raise KafkaIOError(f"DescribeConfigs of {topic} failed: error {res[0]} {res[1] or ''}".strip())
        return {e[0]: e[1] for r in responses for res in r.resources for e in res[4] if e[1] is not None}

    async def create_partitions(self, topic: str, total: int, timeout: float = 30.0) -> None:
        admin = await self.admin()
        await admin.create_partitions({topic: NewPartitions(total_count=total)}, timeout_ms=int(timeout * 1000))
        deadline = time.monotonic() + timeout
        while ((await self.partition_count(topic)) or 0) < total:
            if time.monotonic() > deadline:
                raise KafkaIOError(f"{topic} did not reach {total} partitions within {timeout} s")
            await asyncio.sleep(0.1)

    async def committed(self, group: str, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        """The group's committed offsets (partitions without a commit are left out)."""
        admin = await self.admin()
        res = await admin.list_consumer_group_offsets(group, partitions=[TopicPartition(topic, p) for p in partitions])
        return {tp.partition: om.offset for tp, om in res.items() if om is not None and om.offset >= 0}
