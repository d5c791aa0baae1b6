"""Control records of the layout change protocol, and the log that carries them.

Control records (``__streamkit_layout_acks``, one partition, key = producer id, JSON):

- ``{"v":1, "type":"hb", "producer", "client_id", "host", "pid", "lease_ms", "ts"}``:
  heartbeat, every ``heartbeat_ms`` (1 s by default).
- ``{"v":1, "type":"ack", "producer", "topic", "epoch", "change_id", "ends", "ts"}``:
  ``ends`` maps each partition the producer wrote to the end offset of its last
  batch the broker acknowledged.
- ``{"v":1, "type":"bye", "producer", "ts"}``: clean shutdown (not waited for).
- ``{"v":1, "type":"fenced", "producer", "topic", "epoch", "ts"}``: a producer learnt
  it was fenced (informational, for operators).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable
from functools import partial
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from streamkit.internal_records import (
    INT,
    NUMBER,
    STR,
    Shape,
    decode_guarded,
    int_keyed,
    load_object,
    optional,
    required,
)
from streamkit.kafkaio import FetchedRecord, KafkaIO
from streamkit.layout.registry import ACKS_TOPIC, ACKS_TOPIC_CONFIGS

__all__ = [
    "DEFAULT_HEARTBEAT_MS",
    "DEFAULT_LEASE_MS",
    "LIVE_HORIZON_MS",
    "AckLog",
    "control_record",
    "decode_control",
    "ensure_acks_topic",
    "heartbeat_fields",
    "heartbeat_ts",
    "live_window_ms",
    "publish_control",
]

DEFAULT_LEASE_MS = 3000
DEFAULT_HEARTBEAT_MS = 1000


def _now_ms() -> int:
    return int(time.time() * 1000)


def control_record(kind: str, producer: str, **fields: Any) -> tuple[bytes, bytes]:
    """Key and value of a control record for ``__streamkit_layout_acks``."""
    body = {"v": 1, "type": kind, "producer": producer, "ts": _now_ms(), **fields}
    return producer.encode(), orjson.dumps(body)


def heartbeat_fields(client_id: str, lease_ms: int) -> dict[str, Any]:
    return {"client_id": client_id, "host": socket.gethostname(), "pid": os.getpid(), "lease_ms": lease_ms}


async def ensure_acks_topic(io: KafkaIO, topic: str = ACKS_TOPIC, replication_factor: int = 1) -> None:
    if await io.partition_count(topic) is None:
        await io.create_topic(topic, 1, replication_factor=replication_factor, configs=ACKS_TOPIC_CONFIGS)


LIVE_HORIZON_MS = 120_000
"""How far before an announcement the coordinator looks for heartbeats."""


def live_window_ms(lease_ms: int) -> int:
    """A producer that heartbeated less than this before an announcement may hold a lease."""
    return 2 * lease_ms + 1000


def heartbeat_ts(d: dict[str, Any]) -> int:
    return max(int(d.get("ts", 0)), int(d.get("_ts", 0)))


_CONTROL_FIELDS: dict[str, Shape] = {
    "ts": NUMBER,
    "lease_ms": INT,
    "client_id": STR,
    "host": STR,
    "pid": INT,
    "topic": STR,
    "epoch": INT,
    "change_id": STR,
    "ends": int_keyed(INT),
}


def decode_control(value: bytes | None) -> dict[str, Any]:
    """A control record as :func:`control_record` wrote it (Malformed, or a JSON error, for
    anything else). A record of a type this version does not know is well-formed."""
    d = load_object(value)
    required(d, "type", STR)
    required(d, "producer", STR)
    for name, shape in _CONTROL_FIELDS.items():
        optional(d, name, shape)
    if d["type"] == "ack":
        required(d, "topic", STR)
    return d


class AckLog:
    """Reads ``__streamkit_layout_acks`` from a point in time on."""

    def __init__(self, io: KafkaIO, topic: str = ACKS_TOPIC) -> None:
        self.io = io
        self.topic = topic
        self.pos: int | None = None
        self.last: dict[str, dict[str, Any]] = {}
        """Per producer: its latest heartbeat or bye record."""
        self.acks: set[tuple[str, str, int, str]] = set()
        """(producer, topic, epoch, change_id) of every ack read."""
        self.ends: dict[tuple[str, int, str], dict[int, int]] = {}
        """Per (topic, epoch, change_id): the largest acknowledged end offset per partition."""

    async def seek_time(self, ts_ms: int) -> None:
        hw = await self.io.high_watermark(self.topic, 0)
        self.pos = await self.io.first_offset_at_or_after(self.topic, 0, ts_ms, hw)

    async def poll(self, wait_ms: int = 100) -> int:
        """Read what one fetch returns (waiting up to ``wait_ms`` for news); return records read.

        A short or empty answer does not mean the end: Tansu answers a fetch with what
        it gathered within ``max_wait_ms`` (with 1 ms: from 0 to about 150 records,
        fewer on a busy machine).  :meth:`catch_up` reads to the high watermark.
        """
        if self.pos is None:
            self.pos = 0
        recs, _hw = await self.io.fetch(self.topic, 0, self.pos, max_wait_ms=wait_ms)
        self._apply(recs)
        return len(recs)

    async def catch_up(self) -> None:
        """Read up to the high watermark: every control record written before this call."""
        if self.pos is None:
            self.pos = 0
        recs, end = await self.io.read(self.topic, 0, self.pos)
        self._apply(recs)
        self.pos = max(self.pos, end)

    def _apply(self, recs: Iterable[FetchedRecord]) -> None:
        for r in recs:
            self.pos = r.offset + 1
            d = decode_guarded(r, partial(decode_control, r.value))
            if d is None:  # malformed: skipped
                continue
            kind = d["type"]
            pid = d["producer"]
            if kind in ("hb", "bye"):
                d["_ts"] = r.timestamp
                self.last[pid] = d
            elif kind == "ack":
                change: tuple[str, int, str] = (d["topic"], int(d.get("epoch", -1)), str(d.get("change_id", "")))
                self.acks.add((pid, *change))
                ends = self.ends.setdefault(change, {})
                for p, end in (d.get("ends") or {}).items():
                    if int(end) > ends.get(int(p), -1):
                        ends[int(p)] = int(end)

    def live(self, since_ms: int) -> dict[str, dict[str, Any]]:
        """Producers whose latest control record is a heartbeat at or after ``since_ms``."""
        return {pid: d for pid, d in self.last.items() if d.get("type") == "hb" and heartbeat_ts(d) >= since_ms}

    def acked(self, topic: str, epoch: int, change_id: str) -> set[str]:
        return {p for (p, t, e, c) in self.acks if t == topic and e == epoch and c == change_id}


async def publish_control(
    producer: AIOKafkaProducer, kind: str, pid: str, topic: str = ACKS_TOPIC, **fields: Any
) -> None:
    key, value = control_record(kind, pid, **fields)
    await producer.send_and_wait(topic, value, key=key, partition=0)
