"""The job's record in the cluster: its processor counts, with an epoch.

Kept in the internal topic `__streamkit_jobs` (one partition, so one total order), key =
the app's name. Each record is a whole `JobLayout`: the initial processor count `p0`
(fixed at first start: key -> processor placement and every local store depend on it),
the active count `p`, the count a scale change aims at (`target`), and an epoch that
grows by one at every change. Readers keep, per app, the first record of the highest
epoch: of two writers of the same epoch the first in the log wins and the other learns
it on reading back (`ConcurrentJobChangeError`).

While `target > p`, processor `p` (the next one) is *joining*: hosted beside the
processor that splits (on the same member, with no rebalance), rebuilding the state of
the keys it will take over, without partitions. Its host publishes epoch + 1 with `p + 1`
once it has caught up; the rebalance that follows moves the keys.

While `target < p`, processor `p - 1` (the last one) is *retiring*: the processor its keys
came from (the *receiving* one) is rebuilt, beside itself, into a staging store for the
count `p - 1` (its own keys and the retiring ones); its host publishes epoch + 1 with
`p - 1` once that has caught up, and the staging store replaces the receiving
processor's store at the rebalance that follows (`scaling.adopt_store`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from assignors.linear_hashing import lh_params
from streamkit.errors import JobMismatchError, StreamkitError, TopicNotFoundError
from streamkit.internal_records import (
    INT,
    OPT_INT,
    STR,
    Malformed,
    decode_guarded,
    list_of,
    load_object,
    optional,
    required,
)
from streamkit.kafkaio import FetchedRecord, KafkaIO

JOBS_TOPIC = "__streamkit_jobs"

log = logging.getLogger(__name__)


class ConcurrentJobChangeError(StreamkitError):
    """Another writer published the same epoch of the job first."""


@dataclass(frozen=True)
class JobLayout:
    app: str
    p0: int
    p: int
    epoch: int = 1
    target: int | None = None
    """The processor count a scale change aims at (None: none under way)."""
    by: str = ""
    topics: tuple[str, ...] = ()
    """The job's input topics (what `status` and operators read of it)."""
    incarnation: str = ""
    """Created at the job's first start; every store checkpoint carries it, so that local
    state from another cluster (or from before a reset) is recognised ("": a record
    written before incarnations existed)."""

    @property
    def joining(self) -> int | None:
        """The processor being bootstrapped to join (None: none)."""
        return self.p if self.target is not None and self.target > self.p else None

    @property
    def retiring(self) -> int | None:
        """The processor whose keys go back to the one they came from (None: none)."""
        return self.p - 1 if self.target is not None and self.target < self.p else None

    @property
    def bootstrap(self) -> Bootstrap | None:
        """The processor being rebuilt for the next step of a scale change (None: none)."""
        if self.joining is not None:
            return Bootstrap(self.joining, self.p + 1, lh_params(self.p0, self.p)[1], staging=False)
        if self.retiring is not None:
            receiving = lh_params(self.p0, self.p - 1)[1]
            return Bootstrap(receiving, self.p - 1, receiving, staging=True)
        return None

    @property
    def hosted(self) -> int:
        """Processors hosted by workers: the active ones and the joining one."""
        return self.p + (1 if self.joining is not None else 0)

    def to_json(self) -> bytes:
        body: dict[str, Any] = {
            "processors": self.p0, "p": self.p, "epoch": self.epoch, "target": self.target,
            "by": self.by, "ts": time.time(), "topics": list(self.topics), "incarnation": self.incarnation,
        }  # fmt: skip
        return orjson.dumps(body)

    @classmethod
    def from_json(cls, app: str, data: bytes | None) -> JobLayout:
        """The record ``to_json`` wrote (Malformed, or a JSON error, for anything else)."""
        d = load_object(data)
        p0 = required(d, "processors", INT)
        p, epoch = optional(d, "p", INT, p0), optional(d, "epoch", INT, 1)
        target = optional(d, "target", OPT_INT)
        if p0 < 1 or p < 1 or epoch < 1 or (target is not None and target < 1):
            raise Malformed("processors, p, epoch or target is not positive")
        topics = tuple(optional(d, "topics", list_of(STR), ()))
        by, incarnation = optional(d, "by", STR, ""), optional(d, "incarnation", STR, "")
        return cls(app, p0, p, epoch, target, by, topics, incarnation)

    def stepped(self, by: str) -> JobLayout:
        """The next epoch: one step towards the target (a joining processor is active, or a
        retiring one gone)."""
        assert self.target is not None and self.target != self.p
        p = self.p + (1 if self.target > self.p else -1)
        return replace(self, p=p, epoch=self.epoch + 1, target=None if self.target == p else self.target, by=by)


@dataclass(frozen=True)
class Bootstrap:
    """What a step of a scale change rebuilds: processor ``pid``'s state for ``count``
    active processors, hosted beside processor ``beside``; into its own store (a joining
    processor) or a staging store (``staging``: the receiving processor of a shrink, whose
    own store is live until the handover)."""

    pid: int
    count: int
    beside: int
    staging: bool


def newest_jobs(records: Iterable[FetchedRecord]) -> dict[str, JobLayout]:
    """Per app, the first record of the highest epoch among ``records`` of the jobs log."""
    newest: dict[str, JobLayout] = {}
    for rec in records:
        if rec.key and rec.value is None:  # a tombstone (streamkit reset): the job starts over
            newest.pop(rec.key.decode("utf-8", "replace"), None)
        elif rec.key:
            job = decode_guarded(rec, partial(_decode_job, rec.key, rec.value))
            if job is None:  # malformed: skipped, what the well-formed records say stands
                continue
            name = job.app
            if name not in newest or job.epoch > newest[name].epoch:
                newest[name] = job
    return newest


def _decode_job(key: bytes, value: bytes | None) -> JobLayout:
    if not value:
        raise Malformed("an empty job record (a reset is a tombstone: no value at all)")
    return JobLayout.from_json(key.decode(), value)


async def read_jobs(io: KafkaIO) -> dict[str, JobLayout]:
    """Every job's newest record, by app name."""
    try:
        return newest_jobs(await io.read_topic(JOBS_TOPIC))
    except TopicNotFoundError:
        return {}


async def read_job(io: KafkaIO, app_name: str) -> JobLayout | None:
    """The job's newest record (None: the job never started)."""
    return (await read_jobs(io)).get(app_name)


async def publish_job(io: KafkaIO, job: JobLayout) -> JobLayout:
    """Append ``job`` (whose epoch must be one more than the newest) and read it back."""
    await io.create_topic(JOBS_TOPIC, 1)
    producer = AIOKafkaProducer(**io.connection.client_kwargs(), acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(JOBS_TOPIC, key=job.app.encode(), value=job.to_json(), partition=0)
    finally:
        await producer.stop()
    newest = await read_job(io, job.app)
    if newest is None or newest.epoch != job.epoch or newest.by != job.by or newest.p != job.p:
        raise ConcurrentJobChangeError(
            f"job {job.app!r}: epoch {job.epoch} was published by someone else first ({newest})"
        )
    return newest


async def forget_job(io: KafkaIO, app_name: str) -> bool:
    """Remove the job's record (a tombstone in the jobs log): the next start is a first
    start, with a new incarnation. False if there was none."""
    if await read_job(io, app_name) is None:
        return False
    producer = AIOKafkaProducer(**io.connection.client_kwargs(), acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(JOBS_TOPIC, key=app_name.encode(), value=None, partition=0)
    finally:
        await producer.stop()
    return True


async def recorded_processor_count(io: KafkaIO, app_name: str) -> int | None:
    """The job's recorded p0 (None: the job never started, or no job ever did)."""
    job = await read_job(io, app_name)
    return None if job is None else job.p0


async def resolve_job(
    io: KafkaIO, app_name: str, configured: int | None, default: int, topics: tuple[str, ...] = ()
) -> JobLayout:
    """Return the job's record, writing the first one on first start; refuse a worker
    configured with another initial processor count."""
    job = await read_job(io, app_name)
    if job is None:
        claim = configured if configured is not None else default
        await io.create_topic(JOBS_TOPIC, 1)
        try:
            first = JobLayout(app_name, claim, claim, 1, None, "first start", topics, uuid.uuid4().hex[:12])
            job = await publish_job(io, first)
        except ConcurrentJobChangeError:  # another worker's first start won
            job = await read_job(io, app_name)
            assert job is not None
    if configured is not None and configured != job.p0:
        raise JobMismatchError(
            f"job {app_name!r} was created with {job.p0} processors; this worker is configured "
            f"with processors={configured}. The initial processor count cannot change (placement "
            f"depends on it): use processors={job.p0}, and change the running job's count with "
            f"streamkit scale"
        )
    return job


async def resolve_processor_count(io: KafkaIO, app_name: str, configured: int | None, default: int) -> int:
    """The job's p0, recording the job on first start (see :func:`resolve_job`)."""
    return (await resolve_job(io, app_name, configured, default)).p0


class JobWatcher:
    """Polls the job's record and calls ``on_change(new)`` when its epoch grows."""

    def __init__(self, io: KafkaIO, job: JobLayout, on_change: Callable[[JobLayout], None]) -> None:
        self.io = io
        self.job = job
        self._on_change = on_change
        self._offset = 0  # the jobs log is read on from here: each poll reads only new records

    async def _newest(self) -> JobLayout | None:
        records, end = await self.io.read(JOBS_TOPIC, 0, self._offset)
        self._offset = max(self._offset, end)
        newest = newest_jobs(records).get(self.job.app)
        return newest if newest is not None and newest.epoch > self.job.epoch else None

    async def run(self, interval: float = 0.5) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                newest = await self._newest()
            except Exception as exc:  # noqa: BLE001 - keep watching; the next poll retries
                log.warning("reading the job record of %s failed: %s", self.job.app, exc)
                continue
            if newest is not None and newest.epoch > self.job.epoch:
                log.info(
                    "job %s is now epoch %d: %d processors (target %s)",
                    newest.app,
                    newest.epoch,
                    newest.p,
                    newest.target,
                )
                self.job = newest
                self._on_change(newest)
