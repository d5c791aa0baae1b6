"""Admission's step 6 (``runtime.admission``): which records of a partition batch are
strays (``streamkit.layout.strays``), and which are second copies of forwarded ones.

Records stamped by streamkit's producer pass on the first look at their headers; a
record whose first header only looks like a stamp is judged as an unstamped one. A
forwarded copy names its origin under the cluster's seal (``layout.seal``) and is applied
once; a record carrying the header without a valid seal is ordinary input, said once per
partition.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from aiokafka import TopicPartition

from streamkit.layout.seal import OriginSeal
from streamkit.layout.stamps import stamp_epoch
from streamkit.layout.strays import STRAY_HEADER, StrayRule
from streamkit.runtime.routes import Route

log = logging.getLogger(__name__)

__all__ = ["StrayCheck", "plain_and_in_place", "stamped"]

_NONE_KNOWN: frozenset[bytes] = frozenset()


class StrayCheck:
    """Takes the strays out of a member's partition batches, and counts what it drops."""

    def __init__(self, seal: OriginSeal, name: str) -> None:
        self.seal = seal
        """Tells the copies of strays streamkit forwarded from records carrying the header."""
        self.name = name
        self.stray_copies_dropped = 0
        """Second copies of forwarded strays (a forwarder died before its checkpoint)."""
        self.strays_forwarded_before = 0
        """Strays not forwarded because their copies exist (``Route.forwarded``)."""
        self.unsealed_origins_by: Counter[TopicPartition] = Counter()
        """Per partition: records whose origin header streamkit did not seal (ordinary input)."""
        self.duplicate_strays_by: Counter[TopicPartition] = Counter()
        """Per partition, the two above: second copies of forwarded strays dropped, and strays
        not forwarded again (status's and the metrics' duplicate strays)."""

    def not_forwarded_before(self, tp: TopicPartition, route: Route, strays: list[Any]) -> list[Any]:
        """The strays whose copies do not exist yet (a sweep that died before its checkpoint
        sent some: ``Route.forwarded``)."""
        if not strays or not route.forwarded:
            return strays
        unsent = [r for r in strays if r.offset not in route.forwarded]
        if len(unsent) < len(strays):
            self.strays_forwarded_before += len(strays) - len(unsent)
            self.duplicate_strays_by[tp] += len(strays) - len(unsent)
        return unsent

    def take(self, tp: TopicPartition, route: Route, records: list[Any]) -> tuple[list[Any], list[Any]]:
        """(records to apply, strays): admission's step 6. Records stamped by streamkit's producer pass
        on the first look at their headers; copies of forwarded strays are applied once."""
        rule = route.strays
        assert rule is not None
        if rule.everything:
            return [], records
        known = rule.known_in_place(records[0].offset) or _NONE_KNOWN  # a bare record of one is in place
        first = records[0]
        if not first.headers and first.key not in known and not any(r.headers for r in records):
            # a plain producer's batch of keys not seen lately (a million keys): checked at once
            if not rule.strays_in(records):
                return records, []
        if not first.headers:  # a plain producer's batch: one test per record, then the few left
            odd = [r for r in records if r.headers or r.key not in known]
            if odd:
                odd = [r for r in odd if not (h := r.headers) or not stamped(h) or h[-1][0] == STRAY_HEADER]
        else:  # the records of a producer batch share its stamp (one object): an identity test each
            h0 = records[0].headers
            passes = stamped(h0) and h0[-1][0] != STRAY_HEADER  # a stamp, not a stray's copy
            odd = [r for r in records if r.headers is not h0] if passes else records
            if odd:
                odd = [
                    r for r in odd
                    if ((h := r.headers) and (not stamped(h) or h[-1][0] == STRAY_HEADER))
                    or (not h and r.key not in known)
                ]  # fmt: skip
        if not odd:
            return records, []
        seen = route.proc.seen_strays
        # a forwarded copy ends with its sealed origin (stamped, unless its topic has no layout)
        out: set[int] = set()
        judged: list[Any] = []  # unstamped records that are no copy: the stray rule's
        for r in odd:
            h = r.headers
            if h and h[-1][0] == STRAY_HEADER:
                origin = self.seal.origin(tp.topic, r)
                if origin is not None:
                    if not seen.first_time(tp.topic, tp.partition, origin, r.offset):
                        out.add(id(r))
                        self.stray_copies_dropped += 1
                        self.duplicate_strays_by[tp] += 1
                    continue
                self._unsealed(tp, r)
            if not h or not stamped(h):
                judged.append(r)
        strays = rule.strays_in(judged) if judged else []
        out.update(id(r) for r in strays)
        return (records if not out else [r for r in records if id(r) not in out]), strays

    def _unsealed(self, tp: TopicPartition, record: Any) -> None:
        """A record claiming to be a forwarded stray whose seal does not verify (a plain
        producer's header, or a copy mirrored from another cluster): ordinary input."""
        self.unsealed_origins_by[tp] += 1
        if self.unsealed_origins_by[tp] == 1:
            log.warning(
                "%s: %s[%d]@%d carries %s but streamkit did not forward it here (its seal does not verify): "
                "handled as ordinary input (said once per partition)",
                self.name, tp.topic, tp.partition, record.offset, STRAY_HEADER,
            )  # fmt: skip


def stamped(headers: Any) -> bool:
    """Whether a record's first header is a stamp naming a layout epoch (``stamp_epoch``):
    a record whose first header only looks like one (forged, or damaged) is judged as an
    unstamped one, by where its key is placed."""
    return stamp_epoch(headers) is not None


def plain_and_in_place(rule: StrayRule, records: list[Any]) -> bool:
    """Whether ``records`` all lack headers (a plain producer's) and all have keys known in
    place: then no record has an epoch to check or is a stray. One pass tells both, where
    the two checks would each take one; any other batch takes the two."""
    h0 = records[0].headers
    if h0:
        return False
    known = rule.known_in_place(records[0].offset)
    if not known or records[0].key not in known:  # at a million keys most batches end here
        return False
    return not [r for r in records if r.headers is not h0 or r.key not in known]
