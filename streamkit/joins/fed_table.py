"""Tables fed by a topic (a KTable): ``app.table("customers", source=customers_topic)``.

Each key's values are kept with their record timestamps (a versioned table, as Kafka
Streams' versioned stores of KIP-889): a handler of another topic that reads
``customers.get(key)`` gets the value the key had at the timestamp of the record it
handles, the latest version at or before it. With the inputs merged in time order
(``streamkit.joins.merge``) that version has been applied whenever the source topic's
records of the key come in timestamp order; an order that is itself late still gets
the customer of its own time. A tombstone (a record without a value) deletes as of its
timestamp. Versions older than ``history`` before the key's newest are dropped, but
for the last of them (lookups that far back still get an answer). A record that comes
out of order older than that last one kept would be dropped as soon as it came: it is
late instead, a dead letter with reason ``late`` naming the table, the key and its
timestamp (as a stream join's late record is), and the table is left as it was.

The table lives in each processor's store like any other: it is checkpointed, written
to the changelog, restored, rebuilt and moved with its keys when processors scale. The
runtime feeds it through a handler of the source topic (:meth:`FedTable.feed`) that
runs before the app's own handlers of that topic; handlers only read it.
"""

from __future__ import annotations

import bisect
import math
import struct
from collections.abc import Iterable, Iterator
from typing import Any

from stores.serde import Serde, SerdeError
from streamkit.tables import Table
from streamkit.topics import Topic
from streamkit.windows import LateRecordError

__all__ = ["DEFAULT_HISTORY_SECONDS", "FedTable", "Version", "VersionsSerde", "copartition_problem"]

DEFAULT_HISTORY_SECONDS = 86_400.0
"""How far back before a key's newest version older ones are kept (a day)."""

Version = tuple[int, Any]
"""(timestamp in ms, value; None: deleted)."""

_HEAD = struct.Struct(">qi")  # timestamp, length of the encoded value (-1: a tombstone)
_MISSING: Any = object()


def _ts(version: Version) -> int:
    return version[0]


class VersionsSerde:
    """A key's versions, oldest first, as bytes: per version its timestamp, the length
    of its value as ``inner`` encodes it (-1: deleted) and those bytes."""

    def __init__(self, inner: Serde) -> None:
        self.inner = inner

    def dumps(self, versions: list[Version]) -> bytes:
        parts: list[bytes] = []
        dumps = self.inner.dumps
        for ts, value in versions:
            if value is None:
                parts.append(_HEAD.pack(ts, -1))
            else:
                data = dumps(value)
                parts.append(_HEAD.pack(ts, len(data)))
                parts.append(data)
        return b"".join(parts)

    def loads(self, data: bytes) -> list[Version]:
        out: list[Version] = []
        at, end, loads = 0, len(data), self.inner.loads
        try:
            while at < end:
                ts, size = _HEAD.unpack_from(data, at)
                at += _HEAD.size
                if size < 0:
                    out.append((ts, None))
                    continue
                out.append((ts, loads(data[at : at + size])))
                at += size
        except struct.error as exc:
            raise SerdeError("VersionsSerde", data, str(exc)) from None
        return out

    def __repr__(self) -> str:
        return f"VersionsSerde({self.inner!r})"


class FedTable(Table):
    """A table fed by a topic: read it in handlers (``get``, ``[]``, ``in``, ``as_of``),
    never write it. See the module docstring."""

    def __init__(self, name: str, source: Topic, history: float = DEFAULT_HISTORY_SECONDS) -> None:
        if not (math.isfinite(history) and history >= 0.001):  # (versions are kept by the ms)
            raise ValueError(f"table {name!r}: history must be a finite number of seconds >= 0.001, got {history!r}")
        super().__init__(name, source.key_serde, VersionsSerde(source.value_serde))
        self.source = source
        self.history_ms = int(history * 1000)
        self._clock: Any = None

    def bind(self, backend: Any, clock: Any = None) -> None:
        super().bind(backend, clock)
        self._clock = clock

    def _now(self) -> int | None:
        """The timestamp of the record being handled (None: no record, e.g. a timer)."""
        try:
            ts = self._clock.timestamp if self._clock is not None else None
        except AttributeError:  # a context that has handled no record yet
            return None
        return ts if isinstance(ts, int) and ts >= 0 else None

    # -- reads ------------------------------------------------------------------------------
    def as_of(self, key: Any, timestamp: int | None, default: Any = None) -> Any:
        """The key's value at ``timestamp`` (ms; None: its latest), else ``default``."""
        versions = self._backend.get(key, None)
        if not versions:
            return default
        if timestamp is None:
            value = versions[-1][1]
        else:
            i = bisect.bisect_right(versions, timestamp, key=_ts)
            if i == 0:
                return default
            value = versions[i - 1][1]
        return default if value is None else value

    def get(self, key: Any, default: Any = None) -> Any:
        return self.as_of(key, self._now(), default)

    def __getitem__(self, key: Any) -> Any:
        value = self.as_of(key, self._now(), _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return self.as_of(key, self._now(), _MISSING) is not _MISSING

    def items(self) -> Iterator[tuple[Any, Any]]:  # type: ignore[override]
        """Every key's latest value (deleted keys left out)."""
        for key, versions in self._backend.items():
            if versions and versions[-1][1] is not None:
                yield key, versions[-1][1]

    def versions(self, key: Any) -> list[Version]:
        """The key's versions kept, oldest first."""
        return list(self._backend.get(key, None) or ())

    # -- writes: the source topic's only -------------------------------------------------------
    def __setitem__(self, key: Any, value: Any) -> None:
        raise TypeError(self._read_only())

    def __delitem__(self, key: Any) -> None:
        raise TypeError(self._read_only())

    def _read_only(self) -> str:
        return (
            f"table {self.name!r} is fed by topic {self.source.name!r}: handlers read it; "
            f"its records (a tombstone deletes) write it"
        )

    def feed(self, key: Any, value: Any, ctx: Any) -> None:
        """The source topic's handler: the record's value becomes the key's version at
        the record's timestamp (a later record of the same timestamp wins)."""
        if key is None:
            raise ValueError(f"table {self.name!r}: a record of {self.source.name!r} without a key has no row to feed")
        ts = ctx.timestamp
        versions: list[Version] = list(self._backend.get(key, None) or ())
        at = len(versions) if not versions or versions[-1][0] <= ts else bisect.bisect_right(versions, ts, key=_ts)
        if at and versions[at - 1][0] == ts:
            versions[at - 1] = (ts, value)  # the same time: the later record replaces it
        elif self._too_old(versions, at):
            raise self._late(key, ts, versions[-1][0], getattr(ctx, "stream_time", -1))
        else:
            versions.insert(at, (ts, value))
        keep_from = versions[-1][0] - self.history_ms
        cut = bisect.bisect_left(versions, keep_from, key=_ts) - 1  # the last version before: kept
        if cut > 0:
            del versions[:cut]
        self._backend[key] = versions

    def _too_old(self, versions: list[Version], at: int) -> bool:
        """Whether a version inserted at ``at`` would be dropped at once: a newer one is
        older than ``history`` before the key's newest (and kept as the last of those)."""
        return at < len(versions) and versions[at][0] < versions[-1][0] - self.history_ms

    def _late(self, key: Any, ts: int, newest: int, stream_time: int) -> LateRecordError:
        """The error of a source record too old for the key's history: no lookup could see
        its version, so it is late (a dead letter with reason ``late``) rather than kept a
        moment and dropped without a word."""
        return LateRecordError(
            f"table {self.name!r}: a record of {self.source.name!r} for key {key!r} at {ts} ms is older than the "
            f"key's history keeps (history {self.history_ms / 1000:g} s before its newest version at {newest} ms, "
            f"and a newer version before that is kept): no lookup could see it, the record is late",
            self.name, ts, ts, stream_time,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"<FedTable {self.name} from {self.source.name}>"


def copartition_problem(tables: Iterable[Table], inputs: Iterable[Topic]) -> str | None:
    """One line naming a table fed by a topic whose keys cannot reach the processors of
    another input's same keys (None: every pair can). Processors own keys by the hash of
    their bytes, so a fed table and a stream meet only if they encode keys alike."""
    topics = list(inputs)
    for table in tables:
        if not isinstance(table, FedTable):
            continue
        source = table.source
        for topic in topics:
            if topic.name != source.name and repr(topic.key_serde) != repr(source.key_serde):
                return (
                    f"table {table.name!r} is fed by topic {source.name!r} (keys {source.key_serde!r}) but the app "
                    f"also reads topic {topic.name!r} (keys {topic.key_serde!r}): a key reaches the same processor "
                    "from both only if both encode it alike; declare them with the same key_serde"
                )
    return None
