"""A partition batch's records given the time their topic's ``timestamp=`` reads from
them (``streamkit.timestamps``), before anything orders or applies them by time: the
time-ordered merge, stream time, windows, ``ctx.timestamp``. Called on every admitted
batch, by the member, by rebuilds and by the test driver alike."""

from __future__ import annotations

from typing import Any

from streamkit.runtime.admission import Admitted
from streamkit.runtime.routes import Route
from streamkit.timestamps import TimestampError, extractor

__all__ = ["restamp"]


def restamp(route: Route, admitted: Admitted) -> None:
    """Set each record's ``timestamp`` to the time read from it, keeping the Kafka one in
    ``kafka_timestamp`` (what the topic's function is given, however often a record
    passes: the test driver's restart hands the same records over again). A record whose
    time cannot be read leaves the batch for ``admitted.rejected`` (delivered ones only: a
    rebuilt record was reported when the group first handled it). One whose key or value
    does not decode gets time -1, which moves no stream time (its Kafka time, the wall
    clock, would close every window), and the handlers' decode dead-letters it."""
    spec = route.handlers[0].topic.timestamp if route.handlers else None
    if spec is None or not (admitted.rebuild or admitted.deliver):
        return
    extract = extractor(route.handlers[0].topic.name, spec)
    kl, vl = route.key_loads, route.value_loads
    for name in ("rebuild", "deliver"):
        records: list[Any] = getattr(admitted, name)
        kept: list[Any] = []
        for rec in records:
            kafka_ms = getattr(rec, "kafka_timestamp", None)
            if kafka_ms is None:
                kafka_ms = rec.kafka_timestamp = rec.timestamp
            try:
                key = kl(rec.key) if rec.key is not None and kl is not None else rec.key
                value = vl(rec.value) if rec.value is not None and vl is not None else rec.value
            except Exception:  # noqa: BLE001 - the handlers' decode reports it
                rec.timestamp = -1
                kept.append(rec)
                continue
            try:
                rec.timestamp = extract(key, value, kafka_ms)
            except TimestampError as exc:
                if name == "deliver":
                    admitted.rejected.append((rec, "timestamp", str(exc)))
                continue
            kept.append(rec)
        if len(kept) != len(records):
            setattr(admitted, name, kept)
