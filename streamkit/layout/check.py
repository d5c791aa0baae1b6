"""Scan a topic for records a consumer would not apply as they lie: late and misplaced
ones, and strays of plain producers with whether each was forwarded
(``streamkit topics check``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from assignors.murmur2 import key_hash
from streamkit.layout.model import PartitionMode
from streamkit.layout.registry import LayoutRegistry
from streamkit.layout.stamps import (
    RecordStatus,
    classify_record,
    record_epoch,
    record_producer,
    violation_record,
)
from streamkit.layout.strays import stray_rule

__all__ = ["CheckReport", "check_topic"]


@dataclass
class CheckReport:
    topic: str
    epoch: int
    counts: Counter[str]
    violations: list[dict[str, Any]]
    late_harmless: int = 0
    strays: dict[int, int] = field(default_factory=dict)
    """Per partition: records lying where the layout does not place them (``strays``)."""
    unforwarded: dict[int, int] = field(default_factory=dict)
    """Per partition: strays with no forwarded copy in the topic (dead-lettered or waiting)."""


async def check_topic(bootstrap: str, topic: str, *, registry: LayoutRegistry | None = None) -> CheckReport:
    """Read ``topic`` to its end and classify every record by its epoch header
    (``stamps.classify_record``); violations are late or misplaced records."""
    own = registry is None
    reg = registry or LayoutRegistry(bootstrap, client_id="streamkit-check")
    if own:
        await reg.start()
    try:
        layout = await reg.load(topic)
        seal = await reg.load_origin_seal(create=False)  # a diagnostic writes nothing
        counts: Counter[str] = Counter()
        violations: list[dict[str, Any]] = []
        harmless = 0
        strays: dict[int, list[int]] = {}
        forwarded: set[tuple[int, int]] = set()
        for p in range(layout.physical):
            rule = stray_rule(layout, p, swept=layout.mode(p) == PartitionMode.NONE)
            recs, _ = await reg.io.read(topic, p, 0)
            for r in recs:
                if seal.copy_of(topic, r) is not None:  # a copy for compaction: its original is checked where it lies
                    counts["copy"] += 1
                    continue
                ep = record_epoch(r.headers)
                if ep is not None and ep > layout.epoch:
                    layout = await reg.ensure_at_least(topic, ep)
                kh = key_hash(r.key) if r.key is not None else None
                if rule is not None and (rule.everything or (ep is None and rule.is_stray(r.offset, kh))):
                    strays.setdefault(p, []).append(r.offset)
                    continue
                if (origin := seal.origin(topic, r)) is not None:
                    forwarded.add(origin)
                v = classify_record(layout, p, r.offset, ep, kh)
                counts[v.status.value] += 1
                if v.violation:
                    violations.append(
                        violation_record(
                            topic, p, r.offset, r.key, v, record_producer(r.headers), layout_epoch=layout.epoch
                        )
                    )
                elif v.status == RecordStatus.LATE:
                    harmless += 1
        counts["stray"] = sum(len(offsets) for offsets in strays.values())
        unforwarded = {p: n for p, offsets in strays.items() if (n := sum((p, o) not in forwarded for o in offsets))}
        return CheckReport(
            topic, layout.epoch, +counts, violations, harmless, {p: len(o) for p, o in strays.items()}, unforwarded
        )
    finally:
        if own:
            await reg.stop()
