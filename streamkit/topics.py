"""Topic declarations: a name plus the serdes of its keys and values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stores.serde import Serde, serde_for


@dataclass(frozen=True)
class Topic:
    name: str
    key_serde: Serde = field(default_factory=lambda: serde_for("str"))
    value_serde: Serde = field(default_factory=lambda: serde_for("json"))
    ordered_delivery: bool = True

    @classmethod
    def declare(cls, name: str, key_serde: Any = "str", value_serde: Any = "json") -> Topic:
        if not name or not isinstance(name, str):
            raise ValueError(f"topic name must be a non-empty string, got {name!r}")
        return cls(name, serde_for(key_serde), serde_for(value_serde))

    def encode_key(self, key: Any) -> bytes | None:
        return None if key is None else self.key_serde.dumps(key)

    def encode_value(self, value: Any) -> bytes | None:
        return None if value is None else self.value_serde.dumps(value)
