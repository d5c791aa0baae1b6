"""Offline replay of the app's own handlers, one key at a time (the Spark backfill's mode 2).

The batch path and the streaming path run the same handler functions over the same
records in the same per-key order, so their state cannot drift. What the replay does
differently is only what it must: state is an in-memory map per key, output is dropped
(as when a processor rebuilds state), and a handler that reaches outside its own key's
state — another key, or iterating a table — is refused with `ReplayError`, because a
per-key replay cannot reproduce it. Records that fail to decode or whose handler raises
are skipped exactly as the worker skips them (it sends them to the dead-letter topic).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from streamkit.app import App, HandlerSpec
from streamkit.context import Context, Outbox, ReplayRecord
from streamkit.errors import ReplayError
from streamkit.tables import Table
from streamkit.windows import BookTable, LateRecordError, WindowedTable

_UNREADABLE = object()  # a key its topic's key serde cannot read


class _KeyScopedState:
    """A table backend that only lets the handler touch the current record's key."""

    def __init__(self, table: Table, replay: Replayer) -> None:
        self.table = table
        self.replay = replay
        self.data: dict[Any, Any] = {}

    def _check(self, key: Any) -> None:
        own = key[0] if isinstance(self.table, WindowedTable | BookTable) else key
        if own != self.replay.current_key:
            raise ReplayError(
                f"handler {self.replay.current_handler} touched key {own!r} of table "
                f"{self.table.name!r} while handling key {self.replay.current_key!r}; the "
                "backfill replays each key alone, so handlers must only use their own key's state"
            )

    def get(self, key: Any, default: Any = None) -> Any:
        self._check(key)
        return self.data.get(key, default)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._check(key)
        self.data[key] = value

    def __delitem__(self, key: Any) -> None:
        self._check(key)
        del self.data[key]

    def __contains__(self, key: Any) -> bool:
        self._check(key)
        return key in self.data

    def items(self) -> Iterator[tuple[Any, Any]]:
        raise ReplayError(
            f"handler {self.replay.current_handler} iterates table {self.table.name!r}; "
            "a per-key replay cannot reproduce a handler that reads other keys' state"
        )


@dataclass
class ReplayStats:
    records: int = 0
    skipped_decode: int = 0
    handler_errors: int = 0
    late: int = 0
    """Records late for a windowed table (a worker sends them to the dead letters, reason
    ``late``, or to ``on_late``): left out, as there, and counted."""
    errors: list[str] = field(default_factory=list)


class Replayer:
    """Runs `app`'s handlers of `topics` (one topic, or several whose records arrive
    merged in time order, each record naming its topic) over one key's records at a time."""

    def __init__(self, app: App, topics: str | Sequence[str]) -> None:
        names = [topics] if isinstance(topics, str) else list(topics)
        for name in names:
            if not app.handlers.get(name):
                raise ReplayError(f"app {app.name!r} has no handler for topic {name!r}")
            if app.handlers[name][0].topic.timestamp is not None:  # (backfill_replay refuses it before Spark runs)
                raise ReplayError(
                    f"topic {name!r} of app {app.name!r} takes its records' time from them (timestamp=): a replay "
                    "orders and windows a history by its timestamp column, so it cannot build these stores yet"
                )
        self.app = app
        self.topic = names[0]
        self.specs_of: dict[str, list[HandlerSpec]] = {name: app.handlers[name] for name in names}
        self.current_key: Any = None
        self.current_handler = ""
        self.stats = ReplayStats()
        self._loop: asyncio.AbstractEventLoop | None = None

    def run_key(
        self,
        key: bytes | None,
        records: Iterable[tuple[Any, ...]],
        close_through: int = -1,
    ) -> dict[str, dict[bytes, bytes]]:
        """Replay one key's records, given in order as (value, timestamp_ms, partition,
        offset), optionally followed by the stream time of the key's processor as the
        record is applied (what windowed tables judge late records by; -1 or none: none
        is late) and by the record's topic (when the replayer has several).

        ``close_through``: the processor's stream time at the end of the history: the
        key's windows that it closes are recorded closed, with no callback (as a rebuild
        does: their output belongs to the history), so a worker going on from the stores
        does not close them again; those past their retention are deleted.

        Returns, per table, the stored bytes (key as stored -> value) the key's state ends with.
        """
        app = self.app
        states = {name: _KeyScopedState(t, self) for name, t in app.tables.items()}
        outbox = Outbox()
        outbox.suppress = True
        ctx = Context(outbox)
        for name, t in app.tables.items():
            if isinstance(t, WindowedTable):  # its windows, placed over its book (if it has one)
                t.bind(t.state_over(states[name], states.get(t.book_name), index=False), ctx)
            else:
                t.bind(states[name], ctx)
        seen: dict[str, tuple[Any, Any, list[HandlerSpec]]] = {}  # per topic: its key as read, serdes, handlers
        try:
            for value, ts, partition, offset, *more in records:
                self.stats.records += 1
                ctx.stream_time = more[0] if more else -1
                name = more[1] if len(more) > 1 else self.topic
                known = seen.get(name)
                if known is None:
                    specs = self.specs_of[name]
                    topic = specs[0].topic
                    try:
                        k = topic.key_serde.loads(key) if key is not None else None
                    except Exception as exc:  # noqa: BLE001 - the worker dead-letters these records
                        self.stats.errors.append(f"key {key!r} of topic {name!r}: {type(exc).__name__}: {exc}")
                        k = _UNREADABLE
                    known = seen[name] = (k, topic.value_serde, specs)
                k, value_serde, specs = known
                if k is _UNREADABLE:
                    self.stats.skipped_decode += 1
                    continue
                self.current_key = k
                try:
                    v = value_serde.loads(value) if value is not None else None
                except Exception:  # noqa: BLE001
                    self.stats.skipped_decode += 1
                    continue
                ctx._rec = ReplayRecord(name, partition, offset, ts, key, value)
                for spec in specs:
                    self.current_handler = spec.name
                    try:
                        result = spec.fn(k, v, ctx)
                        if spec.is_async:
                            result = self._run(result)
                    except ReplayError:
                        raise
                    except LateRecordError:
                        self.stats.late += 1
                    except Exception as exc:  # noqa: BLE001 - user code, as the worker does
                        self.stats.handler_errors += 1
                        if len(self.stats.errors) < 20:
                            self.stats.errors.append(f"{spec.name} at offset {offset}: {exc!r}")
        finally:
            for t in app.tables.values():
                t.bind(None)
        if close_through >= 0:
            _close_through(app, states, close_through)
        out: dict[str, dict[bytes, bytes]] = {}
        for name, state in states.items():
            table = app.tables[name]
            ks, vs = table.store_key_serde, table.value_serde
            out[name] = {ks.dumps(sk): vs.dumps(val) for sk, val in state.data.items()}
        return out

    def _run(self, coro: Any) -> Any:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()


def _close_through(app: App, states: dict[str, _KeyScopedState], stream_time: int) -> None:
    """Record closed the windows of the replayed key that ``stream_time`` closes, and
    delete those past their retention (what a worker's checkpoint at that stream time
    deletes: ``WindowState.expire``)."""
    for t in app.tables.values():
        if not isinstance(t, WindowedTable):
            continue
        data: Any = states[t.name].data  # plain dicts: the key's entries
        book: Any = states[t.book_name].data if t.book_name in states else {}
        if not data and not book:
            continue
        windows = t.state_over(data, book)
        if book:
            for key, window in windows.due(stream_time):
                windows.closed(key, window)
        windows.expire(stream_time)


def replay_records(
    app: App, topic: str, key: bytes | None, records: Iterable[tuple[bytes | None, int, int, int]]
) -> dict[str, dict[bytes, bytes]]:
    """One-shot form of `Replayer.run_key`."""
    replayer = Replayer(app, topic)
    try:
        return replayer.run_key(key, records)
    finally:
        replayer.close()
