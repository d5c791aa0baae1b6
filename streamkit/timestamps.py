"""Record time from the record itself: ``app.topic("page-views", timestamp="ts")``.

By default a record's time is its Kafka timestamp, which a producer sets when it sends
(the wall clock, unless it says otherwise). Events usually carry their own time in the
value; a topic declared with ``timestamp=`` takes it from there (Kafka Streams'
``TimestampExtractor``, quixstreams' ``timestamp_extractor``): a field name of a dict
value, or a function ``fn(key, value, kafka_timestamp_ms)``. Either gives milliseconds
since the epoch (an int or float), an ISO-8601 text (a naive one is UTC) or a
``datetime``. That time is the record's everywhere: windows, stream time, the
time-ordered merge of several input topics, ``ctx.timestamp`` and tables read as of it.

A record whose time cannot be read (a missing field, a value of another type) is a dead
letter with reason ``timestamp`` naming what was wrong; one whose key or value does not
decode keeps its Kafka time and becomes the usual decode dead letter.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["MAX_MILLIS", "TimestampError", "extractor", "to_millis"]

Extract = Callable[[Any, Any, int], int]
"""(key, value, Kafka timestamp ms) -> the record's time in ms; raises TimestampError."""


class TimestampError(ValueError):
    """A record's time could not be read from it."""


MAX_MILLIS = 253_402_300_799_999
"""The last millisecond of the year 9999: the latest time a datetime holds."""


def to_millis(raw: Any, where: str) -> int:
    """``raw`` (ms since the epoch, an ISO-8601 text or a datetime; without an offset it is
    UTC) as ms since the epoch; ``where`` names it in the error."""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        if not 0 <= raw <= MAX_MILLIS:  # (NaN is not in range either)
            raise TimestampError(f"{where} is {raw!r}: milliseconds since the epoch must be 0 to {MAX_MILLIS}")
        return int(raw)
    if isinstance(raw, str):
        try:
            raw = datetime.fromisoformat(raw)
        except ValueError:
            pass
    if not isinstance(raw, datetime):
        raise TimestampError(f"{where} is {raw!r}: neither milliseconds since the epoch nor an ISO-8601 time")
    when = raw if raw.tzinfo is not None else raw.replace(tzinfo=UTC)
    ms = (when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
    if ms < 0:
        raise TimestampError(f"{where} is {str(raw)!r}: before 1970, which a Kafka timestamp cannot be")
    return ms


def extractor(topic: str, spec: str | Callable[[Any, Any, int], Any]) -> Extract:
    """The function a topic's ``timestamp=`` declares, giving ms or raising TimestampError."""
    if isinstance(spec, str):
        field = spec

        def from_field(key: Any, value: Any, kafka_ms: int) -> int:
            if not isinstance(value, dict):
                raise TimestampError(f"topic {topic!r}: the value is not an object with a field {field!r}")
            if field not in value:
                raise TimestampError(f"topic {topic!r}: the value has no field {field!r} (its time)")
            return to_millis(value[field], f"topic {topic!r}: field {field!r}")

        return from_field

    name = getattr(spec, "__qualname__", repr(spec))

    def from_function(key: Any, value: Any, kafka_ms: int) -> int:
        try:
            raw = spec(key, value, kafka_ms)
        except Exception as exc:  # noqa: BLE001 - user code: the record is a dead letter
            raise TimestampError(f"topic {topic!r}: its timestamp function {name} raised {exc!r}") from exc
        return to_millis(raw, f"topic {topic!r}: the time {name} gave")

    return from_function
