"""Worker heartbeats in `__streamkit_status`, and reading them back for `streamkit status`.

Every worker publishes, every few seconds, what it hosts and how it fares (dead letters
by reason, the current run of consecutive failures, the last error, the records it skipped
on purpose). The status command
reads the newest record of each worker; a worker that stopped cleanly says so, one that
died simply goes stale.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import orjson
from aiokafka import TopicPartition

from streamkit.internal_records import (
    BOOL,
    INT,
    NUMBER,
    OBJECT,
    OPT_STR,
    STR,
    Shape,
    decode_guarded,
    int_keyed,
    list_of,
    load_object,
    malformed_counts,
    optional,
    required,
    row_of,
    str_keyed,
)
from streamkit.kafkaio import FetchedRecord, KafkaIO
from streamkit.runtime.processor import ProcessorState
from streamkit.state.changelog import position_of

STATUS_TOPIC = "__streamkit_status"
STALE_AFTER = 15.0


@dataclass
class WorkerStatus:
    app: str
    worker: str
    pid: int
    host: str
    at: float
    alive: bool
    processors: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    handled: int = 0
    handler_s: float = 0.0
    """Seconds this worker spent in handlers since it started (a running total: the
    autoscaler's busy share is how fast it grows)."""
    checkpoint_s: float = 0.0
    """Seconds this worker spent checkpointing since it started (a running total)."""
    dead_letters: dict[str, int] = field(default_factory=dict)
    consecutive_failures: int = 0
    last_error: str | None = None
    joining: dict[int, dict[str, int]] = field(default_factory=dict)
    """Processors bootstrapping to join the job: {id: {"t2", "t1", "lag", "replayed"}}."""
    ic_ranges: dict[str, int] = field(default_factory=dict)
    """IC ranges in the hosted processors' last checkpoints, per "topic/partition"."""
    strays_forwarded: dict[str, int] = field(default_factory=dict)
    """Strays this worker forwarded since it started, per "topic/partition" they lay in."""
    changelog: dict[int, list[int]] = field(default_factory=dict)
    """Per hosted processor in the job's changelog: [its changelog position, keys changed
    since (what its next checkpoint writes there)]."""
    query_url: str | None = None
    """Where this worker answers queries of state by key (None: it does not)."""
    restoring: dict[int, dict[str, int]] = field(default_factory=dict)
    """Processors restoring their store from the changelog: {id: {"at", "end", "since_ms"}}
    (changelog offsets read to, and to read to)."""
    global_tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per global table, this worker's copy: {"keys", "lag", "skipped": {reason: n}}."""
    standbys: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Per processor this worker keeps a standby copy of: {"position", "lag", "state"}
    (changelog position applied, records behind the partition's end, "restoring" /
    "catching up" / "warm")."""
    skipped: dict[str, dict[str, int]] = field(default_factory=dict)
    """What this worker skipped on purpose since it started (``skipped_counts``):
    {"malformed": {internal topic: n}, "copies": {"topic/partition": n},
    "duplicate_strays": {"topic/partition": n}}; a kind with nothing skipped is left out."""

    @property
    def stale(self) -> bool:
        return self.alive and time.time() - self.at > STALE_AFTER

    def encode(self) -> bytes:
        return orjson.dumps(self.__dict__, option=orjson.OPT_NON_STR_KEYS)


class SkipCounts(Protocol):
    """What a member's admission counts of the records it skips on purpose
    (``streamkit.runtime.admission.Admission``)."""

    @property
    def copies_skipped_by(self) -> Counter[TopicPartition]: ...
    @property
    def duplicate_strays_by(self) -> Counter[TopicPartition]: ...


SKIPPED_KINDS = ("malformed", "copies", "duplicate_strays", "missed_windows", "failed_unmatched")
"""The kinds of records a worker skips on purpose, as its heartbeat names them, and of
what records missed: closed windows a late record did not join (per windowed table),
calls of a left or outer join for a record that met nobody that failed (per join)."""


def skipped_counts(admissions: Iterable[SkipCounts], app: Any = None) -> dict[str, dict[str, int]]:
    """What a worker skipped on purpose, for its heartbeat and metrics: records of internal
    topics that did not decode (this process's, per topic), copies for compaction and second
    copies of forwarded strays (its members', per "topic/partition"); and what ``app``'s
    records missed (this process's): closed windows, per windowed table, and failed calls
    for records that met nobody, per join. Kinds with none left out."""
    copies: Counter[str] = Counter()
    duplicates: Counter[str] = Counter()
    for admission in admissions:
        for tp, n in admission.copies_skipped_by.items():
            copies[f"{tp.topic}/{tp.partition}"] += n
        for tp, n in admission.duplicate_strays_by.items():
            duplicates[f"{tp.topic}/{tp.partition}"] += n
    tables = app.tables.values() if app is not None else ()
    joins = app.joins.values() if app is not None else ()
    kinds = {
        "malformed": malformed_counts(),
        "copies": dict(copies),
        "duplicate_strays": dict(duplicates),
        "missed_windows": {t.name: t.missed.windows for t in tables if getattr(t, "missed", None) and t.missed.windows},
        "failed_unmatched": {j.name: j.failed_unmatched for j in joins if j.failed_unmatched},
    }
    return {kind: dict(sorted(c.items())) for kind, c in kinds.items() if any(c.values())}


@dataclass
class Restores:
    """The restores a member runs, as its heartbeats show them (``beat``: publish one now)."""

    beat: Callable[[], None]
    running: dict[int, dict[str, int]] = field(default_factory=dict)

    def tracker(self, pid: int) -> Callable[[int, int], None]:
        """The progress callback of processor ``pid``'s restore."""
        since = int(time.time() * 1000)

        def on_read(at: int, end: int) -> None:
            self.running[pid] = {"at": at, "end": end, "since_ms": since}
            self.beat()

        return on_read

    def done(self, pid: int) -> None:
        self.running.pop(pid, None)


def changelog_positions(processors: Iterable[ProcessorState]) -> dict[int, list[int]]:
    return {
        proc.id: [pos, sum(c.dirty_count for c in proc.caches.values())]
        for proc in processors
        if (pos := position_of(proc.loaded)) is not None
    }


def ic_counts(processors: Iterable[ProcessorState]) -> dict[str, int]:
    """How many IC ranges the processors' last checkpoints hold, per "topic/partition"."""
    out: dict[str, int] = {}
    for proc in processors:
        for (topic, part), ranges in proc.loaded.ic_ranges.items():
            if ranges:
                out[f"{topic}/{part}"] = out.get(f"{topic}/{part}", 0) + len(ranges)
    return out


async def read_statuses(io: KafkaIO, app_name: str) -> list[WorkerStatus]:
    """The newest heartbeat of each worker of ``app_name``."""
    latest: dict[str, WorkerStatus] = {}
    for rec in await io.read_topic(STATUS_TOPIC):
        status = decode_status(rec.value, app_name, rec=rec)
        if status is not None:
            latest[status.worker] = status
    return sorted(latest.values(), key=lambda s: s.worker)


def decode_status(value: bytes | None, app_name: str, *, rec: FetchedRecord | None = None) -> WorkerStatus | None:
    """One heartbeat record's status, if it is of ``app_name`` (None also for a malformed
    record: skipped, counted and logged, as ``rec``'s topic[partition]@offset if given)."""
    if not value:
        return None
    at = rec if rec is not None else FetchedRecord(STATUS_TOPIC, -1, -1, -1, None, value, ())
    status = decode_guarded(at, partial(parse_status, value))
    return status if status is not None and status.app == app_name else None


_OBJECTS = str_keyed(OBJECT)
_STATUS_FIELDS: dict[str, Shape] = {
    "app": STR,
    "worker": STR,
    "pid": INT,
    "host": STR,
    "at": NUMBER,
    "alive": BOOL,
    "processors": int_keyed(list_of(row_of(STR, INT))),
    "handled": INT,
    "handler_s": NUMBER,
    "checkpoint_s": NUMBER,
    "dead_letters": str_keyed(INT),
    "consecutive_failures": INT,
    "last_error": OPT_STR,
    "joining": int_keyed(OBJECT),
    "ic_ranges": str_keyed(INT),
    "strays_forwarded": str_keyed(INT),
    "changelog": int_keyed(list_of(INT)),
    "query_url": OPT_STR,
    "restoring": int_keyed(OBJECT),
    "global_tables": _OBJECTS,
    "standbys": int_keyed(OBJECT),
    "skipped": str_keyed(str_keyed(INT)),
}
_STATUS_REQUIRED = ("app", "worker", "pid", "host", "at", "alive", "processors")


def parse_status(value: bytes | None) -> WorkerStatus:
    """A heartbeat record as ``WorkerStatus.encode`` wrote it (Malformed, or a JSON error, for
    anything else; fields this version does not know are left out)."""
    d = load_object(value)
    for name, shape in _STATUS_FIELDS.items():
        if name in _STATUS_REQUIRED:
            required(d, name, shape)
        else:
            optional(d, name, shape)
    known = {k: v for k, v in d.items() if k in WorkerStatus.__dataclass_fields__}
    for name in ("processors", "joining", "changelog", "restoring", "standbys"):
        if name in known:
            known[name] = {int(k): v for k, v in known[name].items()}
    known["processors"] = {k: [(t, p) for t, p in v] for k, v in known["processors"].items()}
    return WorkerStatus(**known)
