"""Stream time per key set, while a shrink's staging store holds two processors' keys.

A shrink merges the retiring processor's keys into the receiving processor's (``scaling``).
Until the merged processor goes live, the staging store replays both key sets, and each
must be judged by the stream time of the processor that owned it: a window the retiring
processor had not closed must not be closed (silently, as a replay does) because the
receiving processor's records have moved time further. That would lose its close: the
retiring processor never sent it, and the merged one would take it for sent. So each
key set keeps its own stream time (``SideClocks``), checkpointed with the store; the
windows of a key set close on its own time, without output, as in any replay; and once
the merged processor has applied every record the group handled already (its task
checks, ``Task.go_live_if_caught_up``) the two times become one (the larger),
and what that closes is sent then, once; at the latest when it delivers its first
record live.
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
        return {"p0": self.p0, "p": self.p, "times": {str(pid): t for pid, t in sorted(self.times.items())}}

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any], key_dumps: Mapping[str, Callable[[Any], bytes]]) -> SideClocks | None:
        found = extra.get(SIDES)
        if not found:
            return None
        times = {int(pid): int(t) for pid, t in found.get("times", {}).items()}
        return cls(int(found["p0"]), int(found["p"]), times, key_dumps)
