"""The autoscaler's journal: each look's inputs and decision, and each refused scale, as
records in ``__streamkit_autoscale`` (keyed by app), so that `streamkit status`, `status
--json` and the dashboard show what the controller saw and decided from wherever they run.

One record per look (every ``--interval`` seconds)::

    {"app": "orders", "at": 1764412800.1,
     "controller": {"host": "h1", "pid": 4242, "workers": "local", "dry_run": false,
                    "min": 1, "max": 6, "target_utilization": 0.7, "interval": 5.0},
     "inputs": {"lag": 1200, "lag_seconds": 2.5, "workers": 2, "processors": 2, "settled": true,
                "unsettled": [], "input_rate": 900.0, "applied_rate": 850.0, "busy": 0.8,
                "checkpointing": 0.02},
     "decision": {"action": "out", "workers": 3, "processors": 3, "why": "...", "figures": {...}},
     "refused": null, "kind": "look"}

``decision`` is null on a look without a sample yet (the first ``--window`` seconds), the
rates are left out there; ``refused`` is the job's reason on a record of a scale it refused
(then ``decision`` is the one refused); ``kind`` "step" marks a scale started between looks.
Readers decode every record strictly: one that is not of this shape is skipped, counted and
said once (``streamkit.internal_records``).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson
from aiokafka import AIOKafkaProducer

from streamkit.internal_records import (
    BOOL,
    INT,
    NUMBER,
    OBJECT,
    STR,
    Malformed,
    decode_guarded,
    list_of,
    load_object,
    optional,
    required,
    str_keyed,
)

if TYPE_CHECKING:
    from streamkit.connection import Connection
    from streamkit.kafkaio import KafkaIO

__all__ = [
    "JOURNAL_TOPIC",
    "KEEP_SECONDS",
    "Entry",
    "JournalReader",
    "JournalWriter",
    "autoscale_view",
    "controller_info",
    "parse_entry",
]

log = logging.getLogger(__name__)

JOURNAL_TOPIC = "__streamkit_autoscale"
KEEP_SECONDS = 600.0
"""How far back status and the dashboard read the journal (their chart's span)."""
RETENTION_MS = str(7 * 24 * 3600 * 1000)
SHOWN_DECISIONS = 20
"""Scale decisions and refusals listed (the newest), holds left out."""


@dataclass(frozen=True)
class Entry:
    """One record of the journal (see the module docstring)."""

    app: str
    at: float
    controller: dict[str, Any]
    inputs: dict[str, Any]
    decision: dict[str, Any] | None = None
    refused: str | None = None
    kind: str = "look"
    """"look": one per look; "step": a scale the controller started between looks (the
    processors caught up with the workers)."""

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))


def controller_info(workers: str, dry_run: bool, limits: Mapping[str, Any], interval: float) -> dict[str, Any]:
    """Who is deciding, under which bounds (the ``controller`` of every record)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "workers": workers, "dry_run": dry_run, **limits,
            "interval": interval}  # fmt: skip


_DECISION = {"action": STR, "workers": INT, "processors": INT, "why": STR}
_CONTROLLER = {"host": STR, "pid": INT, "workers": STR, "dry_run": BOOL, "min": INT, "max": INT,
               "target_utilization": NUMBER, "interval": NUMBER}  # fmt: skip
_RATES = ("input_rate", "applied_rate", "busy", "checkpointing")
LATEST_AT = 4_102_444_800.0
"""2100-01-01: a record stamped later is not one a controller wrote."""
_INPUTS_REQUIRED = {"lag": INT, "lag_seconds": NUMBER, "workers": INT, "processors": INT, "settled": BOOL}
_INPUTS_OPTIONAL = {"unsettled": list_of(STR), "input_rate": NUMBER, "applied_rate": NUMBER, "busy": NUMBER,
                    "checkpointing": NUMBER}  # fmt: skip


def parse_entry(value: bytes | None) -> Entry:
    """A journal record as ``Entry.encode`` wrote it (Malformed, or a JSON error, for anything
    else; fields this version does not know are left out)."""
    d = load_object(value)
    app, at = required(d, "app", STR), required(d, "at", NUMBER)
    if not 0 < at < LATEST_AT:
        raise Malformed(f"at {at} is not a time a controller wrote")
    controller, inputs = required(d, "controller", OBJECT), required(d, "inputs", OBJECT)
    for name, shape in _CONTROLLER.items():
        if name not in controller:
            raise Malformed(f"controller.{name} is missing")
        required(controller, name, shape)
    for name, shape in _INPUTS_REQUIRED.items():
        required(inputs, name, shape)
    for name, shape in _INPUTS_OPTIONAL.items():
        optional(inputs, name, shape)
    if any(r in inputs for r in _RATES) and not all(r in inputs for r in _RATES):
        raise Malformed(f"inputs has some of {', '.join(_RATES)}, not all")
    decision = optional(d, "decision", ("object|null", lambda v: v is None or isinstance(v, dict)))
    if decision is not None:
        for name, shape in _DECISION.items():
            if name not in decision:
                raise Malformed(f"decision.{name} is missing")
            required(decision, name, shape)
        optional(decision, "figures", str_keyed(NUMBER))
        if decision["action"] not in ("out", "in", "hold"):
            raise Malformed(f"decision.action {decision['action']!r} is not out, in or hold")
    refused = optional(d, "refused", ("str|null", lambda v: v is None or isinstance(v, str)))
    kind = optional(d, "kind", STR, "look")
    if kind not in ("look", "step"):
        raise Malformed(f"kind {kind!r} is not look or step")
    return Entry(app, float(at), controller, inputs, decision, refused, kind)


class JournalWriter:
    """Publishes the controller's records (``write``); a record that cannot be written is
    said once per run of failures and dropped: the journal shows decisions, it never holds
    one up."""

    def __init__(self, bootstrap: Connection) -> None:
        self.bootstrap = bootstrap
        self._producer: AIOKafkaProducer | None = None
        self._failing = False

    async def write(self, entry: Entry) -> None:
        try:
            if self._producer is None:
                from streamkit.kafkaio import KafkaIO

                async with KafkaIO(self.bootstrap) as io:
                    await io.create_topic(JOURNAL_TOPIC, 1, configs={"retention.ms": RETENTION_MS})
                producer = AIOKafkaProducer(**self.bootstrap.client_kwargs(), acks=1, linger_ms=0)
                await producer.start()
                self._producer = producer
            await self._producer.send_and_wait(JOURNAL_TOPIC, entry.encode(), key=entry.app.encode(), partition=0)
            self._failing = False
        except Exception as exc:  # noqa: BLE001 - a decision stands whether or not it is journaled
            if not self._failing:
                log.warning("cannot write to %s (%s): decisions go on, unjournaled", JOURNAL_TOPIC, exc)
            self._failing = True

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None


@dataclass
class JournalReader:
    """The journal's records of ``app`` from the last ``KEEP_SECONDS``, read on from where
    the last look ended (a dashboard looks every second)."""

    app: str
    entries: deque[Entry] = field(default_factory=deque)
    _next: int | None = None

    async def read_more(self, io: KafkaIO, now: float | None = None) -> list[Entry]:
        now = time.time() if now is None else now
        if await io.partition_count(JOURNAL_TOPIC) is None:
            return []  # no autoscaler ever ran on this cluster
        if self._next is None:
            end = await io.high_watermark(JOURNAL_TOPIC, 0)
            self._next = await io.first_offset_at_or_after(JOURNAL_TOPIC, 0, int((now - KEEP_SECONDS) * 1000), end)
        records, self._next = await io.read(JOURNAL_TOPIC, 0, self._next)
        for rec in records:
            if not rec.value:
                continue
            entry = decode_guarded(rec, partial(parse_entry, rec.value))
            if entry is not None and entry.app == self.app:
                self.entries.append(entry)
        while self.entries and self.entries[0].at < now - KEEP_SECONDS:
            self.entries.popleft()
        return list(self.entries)


def running(entries: Iterable[Entry], now: float) -> bool:
    """Whether the newest record is recent: within three looks (at least 30 s)."""
    newest = max(entries, key=lambda e: e.at, default=None)
    return newest is not None and now - newest.at <= max(30.0, 3 * float(newest.controller.get("interval", 5.0)))


def autoscale_view(entries: list[Entry], now: float) -> dict[str, Any] | None:
    """What status shows of the autoscaler (None: no record in the last ``KEEP_SECONDS``):
    ``controller`` (who decides, under which bounds), ``running``, ``at`` (its newest look),
    ``inputs`` and ``decision`` of that look, ``decisions`` (the newest ``SHOWN_DECISIONS``
    scales and refusals: ``at``, ``action`` out/in/refused, ``workers``, ``processors``
    (wanted), ``why`` (a refusal: the job's reason), ``figures``) and ``history`` (per look:
    ``at``, ``lag``, ``lag_seconds``, ``input_rate``, ``applied_rate``, ``workers``,
    ``processors``; the dashboard's chart)."""
    if not entries:
        return None
    looks = [e for e in entries if e.refused is None and e.kind == "look"]
    newest = looks[-1] if looks else entries[-1]
    decisions = []
    for e in entries:
        d = e.decision or {}
        if e.refused is not None:
            decisions.append({"at": e.at, **d, "action": "refused", "why": e.refused})
        elif d.get("action") in ("out", "in"):
            decisions.append({"at": e.at, **d})
    for d in decisions:
        d.setdefault("figures", {})
    history = [
        {
            "at": e.at,
            **{
                k: e.inputs.get(k)
                for k in ("lag", "lag_seconds", "input_rate", "applied_rate", "workers", "processors")
            },
        }  # fmt: skip
        for e in looks
    ]
    return {
        "controller": newest.controller,
        "running": running(entries, now),
        "at": newest.at,
        "inputs": newest.inputs,
        "decision": newest.decision,
        "decisions": decisions[-SHOWN_DECISIONS:],
        "history": history,
    }
