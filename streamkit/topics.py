"""Topic declarations: a name plus the serdes of its keys and values."""

from __future__ import annotations

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

    @classmethod
    def declare(cls, name: str, key_serde: Any = "str", value_serde: Any = "json", *, strays: str = "forward") -> Topic:
        if not name or not isinstance(name, str):
            raise ValueError(f"topic name must be a non-empty string, got {name!r}")
        if strays not in STRAY_POLICIES:
            raise ValueError(f"topic {name!r}: strays must be one of {', '.join(STRAY_POLICIES)}, got {strays!r}")
        return cls(name, serde_for(key_serde), serde_for(value_serde), strays=strays)

    def encode_key(self, key: Any) -> bytes | None:
        return None if key is None else self.key_serde.dumps(key)

    def encode_value(self, value: Any) -> bytes | None:
        return None if value is None else self.value_serde.dumps(value)
