"""Stream time per key set, while a shrink's staging store holds two processors' keys.

A shrink merges the retiring processor's keys into the receiving processor's (``scaling``).
Until the merged processor goes live, the staging store replays both key sets, and each
must be judged by the stream time of the processor that owned it: a window the retiring
processor had not closed must not be closed (silently, as a replay does) because the
receiving processor's records have moved time further. That would lose its close: the
retiring processor never sent it, and the merged one would take it for sent. So each
key set keeps its own stream time (``SideClocks``), checkpointed with the store; the
windows of a key set close on its own time, without output, as in any replay. Once the
merged processor has applied every record the group handled already (its task checks,
``Task.go_live_if_caught_up``; at the latest when it delivers its first record live) it
goes live: each key set still closes on its own time, with output now, until the two
times may become one (the larger) without judging a record by the other key set's time:

- the key set behind has reached the time the other had when it went live (the records
  of its partitions in between are of that time: judged by the other's, some would be
  late), or
- none of its partitions has a record left that a fetch has seen (the processor reads
  every partition live, as any processor reading several does; and a shrink after the
  last record does not leave the key set behind on its own time for good, its windows
  unclosed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from streamkit.checkpoint_keys import SIDES


@dataclass
class SideClocks:
    """The stream time of each processor's keys in a store that holds several processors'.

    ``p0`` and ``p``: the job's initial processor count and the count whose placement tells
    the key sets apart (the count before the shrink). ``key_dumps``: per table, its keys'
    serde (a table's keys are taken to be the records' keys, as ``purge_moved_keys`` does)."""

    p0: int
    p: int
    times: dict[int, int] = field(default_factory=dict)
    key_dumps: Mapping[str, Callable[[Any], bytes]] = field(default_factory=dict)
    live_from: int | None = None
    """Once live: the time of the key set furthest ahead then (``may_merge``)."""

    def go_live(self) -> bool:
        """The processor delivers live from now on (its closes are sent); whether it did not before."""
        if self.live_from is not None:
            return False
        self.live_from = max(self.times.values(), default=-1)
        return True

    def may_merge(self, *, drained: bool) -> bool:
        """Whether the times may become one now (see the module docstring); ``drained``:
        none of the processor's partitions has records left that a fetch has seen."""
        if self.live_from is None:
            return False
        return drained or min(self.times.values(), default=-1) >= self.live_from

    def side_of(self, key: bytes | None) -> int:
        """The processor that owned a record key (a keyless record: the lowest one)."""
        if key is None:
            return min(self.times, default=0)
        return lh_bucket(key_hash(key), self.p0, self.p)

    def advance(self, key: bytes | None, timestamp_ms: int) -> int:
        """The stream time of the record's key set, with the record applied."""
        side = self.side_of(key)
        now = max(self.times.get(side, -1), timestamp_ms)
        self.times[side] = now
        return now

    def owns(self, side: int, table: str) -> Callable[[Any], bool]:
        """Whether a key of ``table`` (as its handlers see it) belongs to ``side``."""
        dumps = self.key_dumps[table]
        return lambda key: self.side_of(dumps(key)) == side

    def to_extra(self) -> dict[str, Any]:
        out = {"p0": self.p0, "p": self.p, "times": {str(pid): t for pid, t in sorted(self.times.items())}}
        if self.live_from is not None:
            out["live_from"] = self.live_from
        return out

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any], key_dumps: Mapping[str, Callable[[Any], bytes]]) -> SideClocks | None:
        found = extra.get(SIDES)
        if not found:
            return None
        times = {int(pid): int(t) for pid, t in found.get("times", {}).items()}
        live_from = found.get("live_from")
        return cls(int(found["p0"]), int(found["p"]), times, key_dumps, None if live_from is None else int(live_from))
