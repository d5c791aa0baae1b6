"""Where the records of one assigned partition go, and what admission knows of it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from assignors.placement import KeyFilter
from stores.serde import JsonSerde, Serde
from streamkit.app import HandlerSpec
from streamkit.layout.model import TopicLayout
from streamkit.runtime.processor import Position, ProcessorState


def decoder(serde: Serde) -> Callable[[bytes], Any]:
    """The fastest callable that decodes like `serde.loads` (orjson's C function for JSON)."""
    if type(serde) is JsonSerde:
        return orjson.loads
    return serde.loads


def epoch_stamp(layout: TopicLayout | None) -> bytes | None:
    """The epoch header value records must carry to pass unchecked (None: no checks)."""
    if layout is None or not layout.ordered_delivery:
        return None
    return str(layout.epoch).encode()


@dataclass
class Route:
    """One assigned partition: its processor, handlers, decoders and admission state."""

    proc: ProcessorState
    handlers: list[HandlerSpec]
    key_loads: Callable[[bytes], Any]
    value_loads: Callable[[bytes], Any]
    position_key: Position
    rebuild_until: int  # offsets below this were already handled by the group: emit nothing
    committed: int  # the group's committed offset as last known
    layout: TopicLayout | None = None
    epoch_bytes: bytes | None = None  # the layout epoch as stamped: records carrying it pass
    limit: int | None = None  # gate: deliver offsets below it only
    stale_epoch: int | None = None  # a record named a newer layout epoch than ours
    hole: tuple[int, int, float] | None = None  # (start, next offset, first seen): see Admission.cut_at_hole
    key_filter: KeyFilter | None = None
    """Only records whose key hash it accepts are applied (None: every record)."""
    null_keys: bool = True
    """With a key filter: whether records without a key are applied (the partition's owner)."""
    sharers: tuple[int, ...] = ()
    """A shared task: every processor sharing the partition by key range (empty: whole)."""

    @property
    def position(self) -> int:
        """The next offset this partition's processor will apply."""
        return self.proc.positions[self.position_key]

    @position.setter
    def position(self, offset: int) -> None:
        self.proc.positions[self.position_key] = offset

    @classmethod
    def build(
        cls,
        proc: ProcessorState,
        handlers: list[HandlerSpec],
        partition: Position,
        group_position: int,
        layout: TopicLayout | None,
    ) -> Route:
        """The route of `partition` for `proc`, which resumes at its own checkpoint and
        rebuilds without output up to where the group already was."""
        pos = proc.positions.setdefault(partition, 0)
        topic = handlers[0].topic
        return cls(
            proc,
            handlers,
            decoder(topic.key_serde),
            decoder(topic.value_serde),
            partition,
            max(pos, group_position),
            group_position,
            layout,
            epoch_stamp(layout),
        )
