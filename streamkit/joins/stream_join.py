"""Windowed stream-stream joins: ``@app.join(left, right, within=s, how=..., grace=s)``.

``fn(key, left, right, ctx)`` is called once for every pair of records of the same key,
one from each topic, whose timestamps differ by at most ``within`` seconds: when the
second of the two is applied (the first waits in a buffer). ``how="left"`` also calls
``fn(key, left, None, ctx)`` for each left record that never met a right one, and
``how="outer"`` the same for right records (``fn(key, None, right, ctx)``), once no
partner can come any more: when stream time passes the record's time plus ``within``
plus ``grace`` by ``within`` more (see below). Each such call stands alone: one that
raises is logged (key, side, time) and counted (``StreamJoin.failed_unmatched``), and the
other records of its bucket are still called. A record whose time plus ``within`` plus
``grace`` is behind stream time is late: a dead letter (reason ``late``), or the
buffer table's ``@app.on_late`` callbacks.

The buffer is a windowed table (``join-<name>``, ``streamkit.windows``) of tumbling
buckets ``within`` wide: each bucket holds its left and its right records apart (each
with its timestamp, whether it met a partner, its value). A record looks for partners
among the other side's records of its own bucket and the two beside it, then joins its
bucket. A bucket closes (its close callback emits the unmatched records,
``left``/``outer``) ``2 * within + grace`` after its end: by then every record that
could pair with one of its records is late. So the buffer inherits all that windowed
state has: checkpointed with the positions, written to the changelog, restored, rebuilt
without output, moved with its keys when processors scale, closes once per bucket. A
pair's call, like every handler's output, is sent at least once (a crash may repeat the
calls of records applied after the last checkpoint).

Which pairs meet does not depend on the order records arrive in, as long as none is
late; the inputs merged in time order (``streamkit.joins.merge``) keep lateness itself
the same in a live run, a restart and a rebuild.
"""

from __future__ import annotations

import logging
import math
import struct
import time
from collections.abc import Callable
from typing import Any, Literal

from stores.serde import Serde, SerdeError
from streamkit.topics import Topic
from streamkit.windows import LateRecordError, Tumbling, Window, WindowedTable
from streamkit.windows.late import SAY_EVERY

__all__ = ["LEFT", "RIGHT", "BufferSerde", "StreamJoin"]

log = logging.getLogger(__name__)

LEFT, RIGHT = 0, 1
How = Literal["inner", "left", "outer"]
Entry = list[Any]
"""[timestamp ms, met a partner, value]"""
Bucket = list[list[Entry]]
"""[left entries, right entries], each in arrival order."""

_COUNT = struct.Struct(">i")  # left entries in the bucket (the rest are right ones)
_HEAD = struct.Struct(">Bqi")  # met, timestamp, length of the value's bytes (-1: None)


class BufferSerde:
    """A bucket's records as bytes: how many are left ones, then each record (whether it
    met a partner, its timestamp, its value with its topic's value serde)."""

    def __init__(self, left: Serde, right: Serde) -> None:
        self.sides = (left, right)

    def dumps(self, bucket: Bucket) -> bytes:
        parts: list[bytes] = [_COUNT.pack(len(bucket[LEFT]))]
        for side in (LEFT, RIGHT):
            dumps = self.sides[side].dumps
            for ts, met, value in bucket[side]:
                data = b"" if value is None else dumps(value)
                parts.append(_HEAD.pack(1 if met else 0, ts, -1 if value is None else len(data)))
                parts.append(data)
        return b"".join(parts)

    def loads(self, data: bytes) -> Bucket:
        bucket: Bucket = [[], []]
        try:
            (lefts,) = _COUNT.unpack_from(data, 0)
            at, end, n = _COUNT.size, len(data), 0
            while at < end:
                met, ts, size = _HEAD.unpack_from(data, at)
                at += _HEAD.size
                side = LEFT if n < lefts else RIGHT
                value = None if size < 0 else self.sides[side].loads(data[at : at + size])
                at += max(size, 0)
                bucket[side].append([ts, bool(met), value])
                n += 1
        except struct.error as exc:
            raise SerdeError("BufferSerde", data, str(exc)) from None
        return bucket

    def __repr__(self) -> str:
        return f"BufferSerde({self.sides[0]!r}, {self.sides[1]!r})"


class StreamJoin:
    """One declared join: its buffer table and the handlers the app registers for it."""

    def __init__(
        self, name: str, left: Topic, right: Topic, fn: Callable[..., Any], *, within: float, grace: float, how: How
    ) -> None:
        if not (math.isfinite(within) and round(within * 1000) >= 1):  # its buckets are whole ms
            raise ValueError(f"join {name!r}: within must be at least 0.001 seconds, got {within!r}")
        if not (math.isfinite(grace) and grace >= 0):
            raise ValueError(f"join {name!r}: grace must be >= 0 seconds, got {grace!r}")
        if how not in ("inner", "left", "outer"):
            raise ValueError(f"join {name!r}: how must be 'inner', 'left' or 'outer', got {how!r}")
        if left.name == right.name:
            raise ValueError(f"join {name!r}: a topic joined with itself (use one handler)")
        if repr(left.key_serde) != repr(right.key_serde):
            raise ValueError(
                f"join {name!r}: {left.name!r} and {right.name!r} encode keys differently ({left.key_serde!r}, "
                f"{right.key_serde!r}): a key reaches the same processor from both only if both encode it alike"
            )
        self.name, self.left, self.right, self.fn, self.how = name, left, right, fn, how
        self.grace_ms = int(round(grace * 1000))
        hold = 2 * within + grace  # a bucket closes when no record of it can meet another
        self.buffer = WindowedTable(
            f"join-{name}", left.key_serde, BufferSerde(left.value_serde, right.value_serde),
            Tumbling(within, grace=hold, retention=hold),
        )  # fmt: skip
        self.buffer.closes = True
        self.within_ms = self.buffer.window.size_ms  # the buckets' width, rounded as they are
        self.failed_unmatched = 0
        """Calls for records that met nobody (``left``, ``outer``) that raised, since the
        process started: said in a line each, at most one every ``SAY_EVERY`` seconds (the
        next line counts the ones not said)."""
        self._said_at: float | None = None
        self._unsaid = 0

    # -- the handlers of the two topics -----------------------------------------------------
    def on_left(self, key: Any, value: Any, ctx: Any) -> None:
        self._arrive(LEFT, key, value, ctx)

    def on_right(self, key: Any, value: Any, ctx: Any) -> None:
        self._arrive(RIGHT, key, value, ctx)

    def _arrive(self, side: int, key: Any, value: Any, ctx: Any) -> None:
        if key is None:
            raise ValueError(f"join {self.name!r}: a record without a key meets no other")
        ts, stream_time = ctx.timestamp, ctx.stream_time
        if stream_time >= 0 and ts + self.within_ms + self.grace_ms < stream_time:
            raise LateRecordError(
                f"join {self.name!r}: a record at {ts} ms is late (stream time {stream_time} ms, within "
                f"{self.within_ms} ms, grace {self.grace_ms} ms): no partner of it is kept any more",
                self.buffer.name, ts, ts, stream_time,
            )  # fmt: skip
        buffer, within, fn = self.buffer, self.within_ms, self.fn
        other = RIGHT if side == LEFT else LEFT
        own = buffer.window_start(ts)
        met = False
        failed: BaseException | None = None
        for start in (own - within, own, own + within):
            bucket = buffer.get_window(key, start)
            if not bucket or not bucket[other]:
                continue
            changed = False
            for entry in bucket[other]:
                if abs(entry[0] - ts) <= within:
                    try:
                        if side == LEFT:
                            fn(key, value, entry[2], ctx)
                        else:
                            fn(key, entry[2], value, ctx)
                    except Exception as exc:  # noqa: BLE001 - user code: the record is a dead letter, the pair met
                        failed = failed or exc
                    met = True
                    if not entry[1]:
                        entry[1] = changed = True
            if changed:
                buffer.put_window(key, start, bucket)
        entry = [ts, met, value]

        def add(bucket: Bucket | None) -> Bucket:
            if bucket is None:
                bucket = [[], []]
            bucket[side].append(entry)
            return bucket

        buffer.update(key, add)  # buffered even if a call failed: its later partners meet it
        if failed is not None:
            raise failed

    # -- a bucket that closes: the records that met nobody ------------------------------------
    def on_close(self, key: Any, window: Window, bucket: Bucket | None, ctx: Any) -> None:
        if self.how == "inner" or not bucket:
            return
        for side in (LEFT, RIGHT) if self.how == "outer" else (LEFT,):
            for ts, met, value in bucket[side]:
                if not met:
                    self._unmatched(side, key, ts, value, ctx)

    def _unmatched(self, side: int, key: Any, ts: int, value: Any, ctx: Any) -> None:
        """Call ``fn`` for one record that met nobody. A failure is said on its own, naming
        the key, the side and the record's time, and counted in ``failed_unmatched``: the
        input record was applied long ago, so it can no longer be a dead letter as a failed
        pair call's record is, and the bucket's other records are still called."""
        try:
            if side == LEFT:
                self.fn(key, value, None, ctx)
            else:
                self.fn(key, None, value, ctx)
        except Exception:  # noqa: BLE001 - user code: said and counted, the others still called
            self.failed_unmatched += 1
            now = time.monotonic()
            if self._said_at is not None and now - self._said_at < SAY_EVERY:
                self._unsaid += 1  # a bug failing every such call must not flood the log
                return
            also = f"; {self._unsaid} more since the last line" if self._unsaid else ""
            self._said_at, self._unsaid = now, 0
            topic = self.left.name if side == LEFT else self.right.name
            log.exception(
                "join %r: the call for the %s record of %s with key %r at %d ms, which met nobody, failed "
                "(%d such call(s) failed so far%s)",
                self.name, "left" if side == LEFT else "right", topic, key, ts, self.failed_unmatched, also,
            )  # fmt: skip
