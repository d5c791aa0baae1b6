"""Topic declarations: a name plus the serdes of its keys and values, and where an input
record's time comes from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stores.serde import Serde, serde_for

STRAY_POLICIES = ("forward", "dead-letter")


@dataclass(frozen=True)
class Topic:
    name: str
    key_serde: Serde = field(default_factory=lambda: serde_for("str"))
    value_serde: Serde = field(default_factory=lambda: serde_for("json"))
    ordered_delivery: bool = True
    strays: str = "forward"
    """As an input: what happens to a record a plain producer put where the layout does
    not place its key (``streamkit.layout.strays``): ``forward`` it to where the layout
    places it, or send it to the dead letters (``dead-letter``, reason ``misplaced``)."""
    timestamp: str | Callable[[Any, Any, int], Any] | None = None
    """As an input: where a record's time comes from (``streamkit.timestamps``): None, the
    record's Kafka timestamp; a field name of its (dict) value; or ``fn(key, value,
    kafka_timestamp_ms)``. Milliseconds since the epoch, an ISO-8601 text or a datetime."""

    @classmethod
    def declare(
        cls,
        name: str,
        key_serde: Any = "str",
        value_serde: Any = "json",
        *,
        strays: str = "forward",
        timestamp: str | Callable[[Any, Any, int], Any] | None = None,
    ) -> Topic:
        if not name or not isinstance(name, str):
            raise ValueError(f"topic name must be a non-empty string, got {name!r}")
        if strays not in STRAY_POLICIES:
            raise ValueError(f"topic {name!r}: strays must be one of {', '.join(STRAY_POLICIES)}, got {strays!r}")
        if timestamp is not None and not (isinstance(timestamp, str) and timestamp) and not callable(timestamp):
            raise TypeError(
                f"topic {name!r}: timestamp must be a field name of the value or a function "
                f"(key, value, kafka_timestamp_ms) -> time, got {timestamp!r}"
            )
        return cls(name, serde_for(key_serde), serde_for(value_serde), strays=strays, timestamp=timestamp)

    def encode_key(self, key: Any) -> bytes | None:
        return None if key is None else self.key_serde.dumps(key)

    def encode_value(self, value: Any) -> bytes | None:
        return None if value is None else self.value_serde.dumps(value)
