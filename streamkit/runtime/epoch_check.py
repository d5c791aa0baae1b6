"""Admission's steps 3 and 4 (``runtime.admission``): the gate's limit, and the epoch
stamps of a partition batch.

A record stamped with a newer layout epoch than the route's means its layout is stale:
stop before it. One the registry never reaches (``runtime.epochs``) is a dead letter,
``unknown-epoch``. One stamped older and lying beyond a later seal is a late record of a
fenced producer: reported, never applied silently. A copy for compaction sealed by a
producer of this cluster is skipped (its original is where its key is placed).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from aiokafka import TopicPartition

from assignors.linear_hashing import partition_for_key
from assignors.murmur2 import key_hash
from streamkit.layout.model import TopicLayout
from streamkit.layout.seal import OriginSeal
from streamkit.layout.stamps import (
    COPY_HEADER,
    TAG_BYTES,
    classify_record,
    record_epoch,
    record_producer,
    stamp_epoch,
    violation_record,
)
from streamkit.runtime.routes import Route

__all__ = ["STAMPS_KEPT", "EpochCheck", "genuine_copy"]

STAMPS_KEPT = 4096
"""Stamp values a route remembers as current (one per producer writing the partition)."""

Checked = tuple[list[Any], int | None, list[tuple[Any, dict[str, Any]]], list[tuple[Any, str, str]]]
"""(records to deliver, offset to stop and seek back to or None, late-record reports,
records of an epoch the registry never reached)."""


class EpochCheck:
    """Checks a member's partition batches against their gates and stamps."""

    def __init__(self, seal: OriginSeal, group: str) -> None:
        self.seal = seal
        self.group = group
        self.unknown_epochs: dict[str, dict[int, float]] = {}
        """Per topic, layout epochs records were stamped with that the registry did not reach
        when asked, and until when (monotonic seconds; ``streamkit.runtime.epochs``): such
        records are dead letters, not a stop. Then the registry is asked again."""
        self.copies_skipped = 0
        """Copies for compaction skipped (records a streamkit producer wrote to a partition the key left)."""
        self.copies_skipped_by: Counter[TopicPartition] = Counter()
        """The same, per partition."""

    def gate_and_check(self, tp: TopicPartition, route: Route, records: list[Any], *, epochs: bool = True) -> Checked:
        """(records to deliver, offset to stop and seek back to or None, late-record reports,
        records of an epoch the registry never reached); ``epochs=False``: the records carry
        no stamp, so only the gate is applied."""
        stop_at = None
        limit = route.limit
        if limit is not None and records[-1].offset >= limit:
            # Never back: a gate can close below records already delivered (they came before
            # we saw the change, so they carry our epoch and are safe); it holds from here.
            stop_at = max(limit, records[0].offset)
            records = [r for r in records if r.offset < limit]
        eb = route.epoch_bytes
        if eb is None or not records or not epochs:
            return records, stop_at, [], []
        current = route.stamps_current
        h0 = records[0].headers  # shared by the records of its batch: one identity test each
        odd = [r for r in records if (h := r.headers) is not h0 and h and h[0][1] not in current]
        if h0 and h0[0][1] not in current:
            odd.append(records[0])
        if odd:  # a new producer's stamp (learnt if it carries our epoch), or another epoch
            if len(current) > STAMPS_KEPT:
                current.clear()
            current.update(v for r in odd if (v := r.headers[0][1])[TAG_BYTES:] == eb)
            odd = [r for r in odd if r.headers[0][1] not in current]
        if not odd:
            return records, stop_at, [], []
        layout = route.layout
        assert layout is not None
        deliver: list[Any] = []
        late: list[tuple[Any, dict[str, Any]]] = []
        rejected: list[tuple[Any, str, str]] = []
        given_up = self.unknown_epochs.get(tp.topic)
        unknown = {e for e, until in given_up.items() if until > time.monotonic()} if given_up else None
        for r in records:
            if (h := r.headers) and h[0][0] == COPY_HEADER and genuine_copy(tp, layout, r, self.seal):
                self.copies_skipped += 1  # a copy for compaction: its original is where its key is placed
                self.copies_skipped_by[tp] += 1
                continue
            epoch = stamp_epoch(r.headers)  # (the rule strays are judged by: ``stray_check.stamped``)
            if epoch is None or epoch == layout.epoch:
                deliver.append(r)
            elif epoch > layout.epoch and unknown and epoch in unknown:  # the registry did not get there
                why = f"{tp.topic}[{tp.partition}]@{r.offset}: stamped with layout epoch {epoch}, which the "
                rejected.append((r, "unknown-epoch", why + f"layout registry has not reached (it has {layout.epoch})"))
            elif epoch > layout.epoch:  # our layout is stale: stop here, re-read, re-gate
                route.stale_epoch = epoch
                return deliver, r.offset, late, rejected
            else:
                verdict = classify_record(
                    layout, tp.partition, r.offset, epoch, key_hash(r.key) if r.key is not None else None
                )
                if verdict.violation:
                    producer = record_producer(r.headers)
                    late.append(
                        (
                            r,
                            violation_record(
                                tp.topic,
                                tp.partition,
                                r.offset,
                                r.key,
                                verdict,
                                producer,
                                layout_epoch=layout.epoch,
                                group=self.group,
                            ),
                        )
                    )
                else:
                    deliver.append(r)
        return deliver, stop_at, late, rejected


def genuine_copy(tp: TopicPartition, layout: TopicLayout, record: Any, seal: OriginSeal) -> bool:
    """Whether a record whose first header marks it a copy for compaction is one: sealed by
    a producer of this cluster, it names the partition its key is placed in (its
    original's), which is not the one it lies in. A record that claims to be a copy but is
    not (a header a plain producer wrote, or a mirror copied) is input like any other,
    never skipped."""
    if record.key is None or (named := seal.copy_of(tp.topic, record)) is None or named == tp.partition:
        return False
    epoch = record_epoch(record.headers)
    active = layout.active_at(epoch) if epoch is not None and epoch <= layout.epoch else layout.active
    return named == partition_for_key(record.key, layout.n0, active)
