"""The records of the layout registry: how a layout is written to ``__streamkit_layouts``
and read back (every field checked), and which one a reader accepts.

A record: key = the topic name (UTF-8), value = JSON ``{"v": 1, "by": <client id>,
"ts": <ms>, "layout": TopicLayout.to_dict()}``.  A reader holding a layout accepts a
record only if it is newer AND continues the held history (:func:`accepts`; see
``streamkit.layout.registry``); what it refuses it lists as a :class:`Refusal`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson

from streamkit.internal_records import (
    BOOL,
    INT,
    OBJECT,
    OPT_INT,
    STR,
    Malformed,
    Shape,
    list_of,
    obj,
    optional,
    required,
    row_of,
)
from streamkit.layout.model import ChangeKind, LayoutError, TopicLayout

__all__ = ["MalformedLayoutRecordError", "Refusal", "accepts", "decode_layout_record", "encode_layout_record"]


class MalformedLayoutRecordError(LayoutError, Malformed):
    """A registry record streamkit did not write (not a layout record, or a malformed layout)."""


@dataclass(frozen=True)
class Refusal:
    topic: str
    offset: int
    version: tuple[int, int] | None
    held: tuple[int, int] | None
    reason: str


def accepts(current: TopicLayout | None, incoming: TopicLayout) -> tuple[bool, str]:
    """Whether a reader holding ``current`` takes ``incoming`` (see ``streamkit.layout.registry``)."""
    if current is None:
        return True, "first layout"
    if incoming.version <= current.version:
        return False, f"stale: version {incoming.version} is not newer than the held {current.version}"
    if incoming.n0 != current.n0:
        return False, f"conflict: n0 {incoming.n0} != held {current.n0}"
    held = current.change_ids
    if incoming.change_ids[: len(held)] != held:
        return False, (
            f"conflict: epoch {incoming.epoch} does not continue the held history "
            f"(epoch {current.epoch}); another change won"
        )
    return True, "newer"


def encode_layout_record(layout: TopicLayout, *, by: str) -> tuple[bytes, bytes]:
    value = {"v": 1, "by": by, "ts": int(time.time() * 1000), "layout": layout.to_dict()}
    return layout.topic.encode(), orjson.dumps(value)


_OFFSETS = list_of(row_of(INT, INT))
_SEAL_FIELDS: dict[str, Shape] = {
    "epoch": INT,
    "kind": STR,
    "old_active": INT,
    "new_active": INT,
    "partitions": list_of(INT),
    "announce_offsets": _OFFSETS,
    "drain_deadline_ms": OPT_INT,
    "fenced": list_of(STR),
    "change_id": STR,
    "ts_ms": INT,
}
_SEAL_REQUIRED = ("epoch", "kind", "old_active", "new_active")


def decode_layout_record(value: bytes | None) -> tuple[TopicLayout, dict[str, Any]]:
    """A registry record as :func:`encode_layout_record` wrote it; LayoutError (or a JSON
    error) for anything else: every field the layout is made of is checked here."""
    d = orjson.loads(value or b"")
    if not isinstance(d, dict) or "layout" not in d:
        raise MalformedLayoutRecordError("not a layout record")
    try:
        lay = obj(d["layout"], "layout")
        required(lay, "topic", STR)
        for name in ("n0", "active", "physical", "epoch"):
            required(lay, name, INT)
        required(lay, "modes", list_of(INT))
        optional(lay, "ordered_delivery", BOOL)
        for i, seal in enumerate(optional(lay, "seals", list_of(OBJECT), [])):
            for name, shape in _SEAL_FIELDS.items():
                (required if name in _SEAL_REQUIRED else optional)(seal, name, shape)
            if seal.get("seal_offsets") is not None:
                optional(seal, "seal_offsets", _OFFSETS)
            if seal["kind"] not in {k.value for k in ChangeKind}:
                raise Malformed(f"seals[{i}].kind {seal['kind']!r} is not a change kind")
        return TopicLayout.from_dict(lay), d
    except Malformed as exc:
        raise MalformedLayoutRecordError(f"layout: {exc}") from None
