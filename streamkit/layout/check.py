"""Scan a topic for records a consumer would not apply as they lie: late and misplaced
ones (``streamkit topics check``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from assignors.murmur2 import key_hash
from streamkit.layout.model import PartitionMode
from streamkit.layout.registry import LayoutRegistry
from streamkit.layout.stamps import PRODUCER_HEADER, RecordStatus, classify_record, record_epoch, violation_record

__all__ = ["CheckReport", "check_topic"]


@dataclass
class CheckReport:
    topic: str
    epoch: int
    counts: Counter[str]
    violations: list[dict[str, Any]]
    late_harmless: int = 0


async def check_topic(bootstrap: str, topic: str, *, registry: LayoutRegistry | None = None) -> CheckReport:
    """Read ``topic`` to its end and classify every record by its epoch header
    (``stamps.classify_record``); violations are late or misplaced records."""
    own = registry is None
    reg = registry or LayoutRegistry(bootstrap, client_id="streamkit-check")
    if own:
        await reg.start()
    try:
        layout = await reg.load(topic)
        counts: Counter[str] = Counter()
        violations: list[dict[str, Any]] = []
        harmless = 0
        for p in range(layout.physical):
            if layout.mode(p) == PartitionMode.NONE and p >= layout.active:
                pass  # still scanned: late writes may land anywhere
            recs, _ = await reg.io.read(topic, p, 0)
            for r in recs:
                ep = record_epoch(r.headers)
                if ep is not None and ep > layout.epoch:
                    layout = await reg.ensure_at_least(topic, ep)
                kh = key_hash(r.key) if r.key is not None else None
                v = classify_record(layout, p, r.offset, ep, kh)
                counts[v.status.value] += 1
                if v.violation:
                    prod = dict(r.headers).get(PRODUCER_HEADER)
                    violations.append(
                        violation_record(
                            topic, p, r.offset, r.key, v, prod.decode() if prod else None, layout_epoch=layout.epoch
                        )
                    )
                elif v.status == RecordStatus.LATE:
                    harmless += 1
        return CheckReport(topic, layout.epoch, counts, violations, harmless)
    finally:
        if own:
            await reg.stop()
