"""The App: declarations (topics, tables, handlers, callbacks, timers) and nothing else.

Running an app is the runtime's job (`streamkit worker MODULE:APP`, or
`streamkit.runtime.worker.run_worker(app)`); the App only records what the user
declared, so the same declarations serve the streaming worker, the offline replay used
by the Spark backfill, and the CLI. Nothing writes into an App after its module ran.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from stores.serde import serde_for
from streamkit.connection import Connection
from streamkit.joins import FedTable, GlobalTable, StreamJoin
from streamkit.settings import connection_settings, load_settings
from streamkit.sinks.base import Sink
from streamkit.tables import Table
from streamkit.topics import Topic
from streamkit.windows import BookTable, Count, Session, Sliding, Tumbling, WindowedTable, WindowKind

F = TypeVar("F", bound=Callable[..., Any])
SinkT = TypeVar("SinkT", bound=Sink)


@dataclass(frozen=True)
class HandlerSpec:
    topic: Topic
    fn: Callable[..., Any]
    is_async: bool
    concurrency: int = 1
    """Records of different keys this async handler may run at once (1: one at a time)."""

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))


@dataclass(frozen=True)
class TimerSpec:
    seconds: float
    fn: Callable[..., Any]
    is_async: bool
    per_processor: bool


class App:
    """A stateful stream-processing job.

    >>> app = App("orders")
    >>> orders = app.topic("orders")
    >>> totals = app.table("totals", default=int)
    >>> @app.processor(orders)
    ... def total(key, value, ctx):
    ...     totals[key] += value["amount"]
    """

    def __init__(
        self, name: str, broker: str | None = None, *, sasl_oauth_token_provider: Any = None, **settings: Any
    ) -> None:
        if not name or any(c in name for c in "/\\ \t"):
            raise ValueError(f"app name {name!r} must be non-empty without slashes or spaces")
        self.name = name
        if broker is not None:
            settings["broker"] = broker
        self.settings = load_settings(name, settings)  # unset fields fall back to STREAMKIT_* variables
        self._token_provider = sasl_oauth_token_provider
        self.topics: dict[str, Topic] = {}
        self.tables: dict[str, Table] = {}
        self.global_tables: dict[str, GlobalTable] = {}
        self.joins: dict[str, StreamJoin] = {}
        self.handlers: dict[str, list[HandlerSpec]] = {}
        self.timers: list[TimerSpec] = []
        self.keys_revoked_callbacks: list[Callable[..., Any]] = []
        self.keys_assigned_callbacks: list[Callable[..., Any]] = []
        self.window_close_callbacks: dict[str, list[Callable[..., Any]]] = {}
        self.late_callbacks: dict[str, list[Callable[..., Any]]] = {}
        self.sinks: dict[str, Sink] = {}

    def connection(self, broker: str | None = None) -> Connection | None:
        """How every client of this app connects: to ``broker`` (else the app's, else the
        client properties file's), secured as the settings say; None: no broker named."""
        return connection_settings(self.settings, broker, self._token_provider)

    # -- declarations --------------------------------------------------------------------
    def topic(
        self,
        name: str,
        key_serde: Any = "str",
        value_serde: Any = "json",
        *,
        strays: str = "forward",
        timestamp: str | Callable[[Any, Any, int], Any] | None = None,
    ) -> Topic:
        """Declare a topic (input or output) with the serdes of its keys and values.

        ``strays``: as an input, what to do with records a plain Kafka producer put where
        the topic's layout does not place their keys: ``"forward"`` them through the
        layout-aware producer (the default) or ``"dead-letter"`` them (reason ``misplaced``).

        ``timestamp``: as an input, where a record's time comes from (windows, stream time,
        ``ctx.timestamp``): None, its Kafka timestamp (by default the time its producer sent
        it); a field name of its value (``timestamp="ts"``); or ``fn(key, value,
        kafka_timestamp_ms)``. Milliseconds since the epoch, an ISO-8601 text or a datetime;
        a record whose time cannot be read is a dead letter with reason ``timestamp``."""
        topic = Topic.declare(name, key_serde, value_serde, strays=strays, timestamp=timestamp)
        existing = self.topics.get(name)
        if existing is not None and existing != topic:
            raise ValueError(f"topic {name!r} is declared twice with different serdes or settings")
        self.topics[name] = topic
        return topic

    def sink(self, name: str, sink: SinkT) -> SinkT:
        """Declare a sink: a database table handlers write rows to (``ctx.write(sink,
        row)``, a row a dict of column -> JSON value), committed with the processor's
        checkpoint, exactly once (``streamkit.sinks``: ``PostgresSink``, ``DeltaSink``)."""
        if not name or name in self.sinks:
            raise ValueError(f"sink {name!r}: a sink needs a name of its own")
        sink.name = name
        self.sinks[name] = sink
        return sink

    def table(
        self,
        name: str,
        *,
        key_serde: Any = "str",
        value_serde: Any = "json",
        default: Callable[[], Any] | None = None,
        window: WindowKind | None = None,
        source: Topic | str | None = None,
        history: float | None = None,
    ) -> Table:
        """Declare a table; ``window=`` makes it a windowed table: ``Tumbling(60)``,
        ``Hopping(60, 10)``, ``Sliding(60)``, ``Session(30)``, ``Count(100)`` (``streamkit.windows``).

        ``source=topic`` makes it a table fed by that topic (a KTable, ``streamkit.joins.fed_table``):
        each key's latest value, a tombstone deletes; handlers read it, as of the timestamp of the
        record they handle (the topic's serdes; ``history``: seconds of older versions kept, a day
        by default)."""
        if name in self.tables or name in self.global_tables:
            raise ValueError(f"table {name!r} is declared twice")
        if source is not None:
            if window is not None or default is not None:
                raise ValueError(f"table {name!r}: a table fed by a topic takes neither window= nor default=")
            return self._fed_table(name, self._resolve_topic(source), history)
        if history is not None:
            raise ValueError(f"table {name!r}: history= is for a table fed by a topic (source=)")
        if default is not None and not callable(default):
            raise TypeError(f"table {name!r}: default must be a callable such as int, got {default!r}")
        ks, vs = serde_for(key_serde), serde_for(value_serde)
        if window is None:
            table = Table(name, ks, vs, default)
        elif not isinstance(window, Tumbling | Session | Sliding | Count):
            raise TypeError(
                f"table {name!r}: window must be Tumbling, Hopping, Sliding, Session or Count, got {window!r}"
            )
        else:
            table = WindowedTable(name, ks, vs, window, default)
            if table.book_name in self.tables:
                raise ValueError(f"table {name!r}: the name {table.book_name!r} of its book is taken")
        self.tables[name] = table
        self._book(table)
        return table

    def _fed_table(self, name: str, source: Topic, history: float | None) -> FedTable:
        specs = self.handlers.setdefault(source.name, [])
        if specs and specs[0].concurrency > 1:
            raise ValueError(
                f"table {name!r}: topic {source.name!r} has handlers with concurrency={specs[0].concurrency}; "
                "a topic that feeds a table is applied one record at a time, in time order with the other inputs"
            )
        table = FedTable(name, source) if history is None else FedTable(name, source, history)
        self.tables[name] = table
        specs.insert(0, HandlerSpec(source, table.feed, False))  # before the app's own handlers of it
        return table

    def global_table(self, name: str, *, source: Topic | str) -> GlobalTable:
        """Declare a global table: the latest value of each key of ``source`` (decoded with
        its serdes; a tombstone deletes), held whole by every worker and read before any
        processor applies a record, for lookups by any key (``products.get(pid)``), which
        is how a foreign-key join is written. Handlers read it, never write it."""
        if name in self.tables or name in self.global_tables:
            raise ValueError(f"table {name!r} is declared twice")
        table = GlobalTable(name, self._resolve_topic(source))
        self.global_tables[name] = table
        return table

    def _book(self, table: Table) -> None:
        """Declare the hidden book of a windowed table that needs one (``streamkit.windows.state``)."""
        if isinstance(table, WindowedTable) and table.needs_book and table.book_name not in self.tables:
            self.tables[table.book_name] = BookTable(table)

    def _windowed(self, table: Table | str, what: str) -> WindowedTable:
        found = self.tables.get(table) if isinstance(table, str) else table
        if not isinstance(found, WindowedTable) or self.tables.get(found.name) is not found:
            raise ValueError(f"{what}({table!r}): not a windowed table of app {self.name!r}")
        return found

    def on_window_close(self, table: Table | str) -> Callable[[F], F]:
        """Decorate ``fn(key, window, value, ctx)``: called once per window of ``table`` when
        it closes (stream time passes its close time: end plus grace; a count window's n-th
        record), with its final value; ``ctx.send`` its result. Once per window in the
        processor's state: a restart neither repeats a close it checkpointed nor skips one
        (its output, like all output, is at least once); never while state is rebuilt."""
        t = self._windowed(table, "@app.on_window_close")

        def register(fn: F) -> F:
            _check_arity(fn, 4, "@app.on_window_close callback", "(key, window, value, ctx)")
            t.closes = True
            self._book(t)
            self.window_close_callbacks.setdefault(t.name, []).append(fn)
            return fn

        return register

    def join(
        self,
        left: Topic | str,
        right: Topic | str,
        *,
        within: float,
        how: Literal["inner", "left", "outer"] = "inner",
        grace: float = 0.0,
        name: str | None = None,
    ) -> Callable[[F], F]:
        """Decorate ``fn(key, left, right, ctx)`` (sync): a windowed stream-stream join, called
        once for every pair of same-key records of ``left`` and ``right`` whose timestamps
        differ by at most ``within`` seconds; ``how="left"``/``"outer"`` also call it with
        None for the side that never met a partner, once none can come (``grace`` seconds
        of lateness allowed; ``streamkit.joins.stream_join``)."""
        lt, rt = self._resolve_topic(left), self._resolve_topic(right)

        def register(fn: F) -> F:
            _check_arity(fn, 4, "@app.join function", "(key, left, right, ctx)")
            if inspect.iscoroutinefunction(fn):
                raise TypeError(f"@app.join: {fn.__qualname__} must be a plain function (it runs inside the handlers)")
            join = StreamJoin(name or fn.__name__, lt, rt, fn, within=within, grace=grace, how=how)
            buffer = join.buffer
            if buffer.name in self.tables:
                raise ValueError(f"@app.join: the name {buffer.name!r} of its buffer table is taken (name=)")
            for topic in (lt, rt):
                specs = self.handlers.get(topic.name, [])
                if specs and specs[0].concurrency > 1:
                    raise ValueError(
                        f"@app.join: topic {topic.name!r} has handlers with concurrency={specs[0].concurrency}; "
                        "a joined topic is applied one record at a time, in time order with the other inputs"
                    )
            self.joins[join.name] = join
            self.tables[buffer.name] = buffer
            self._book(buffer)
            self.window_close_callbacks.setdefault(buffer.name, []).append(join.on_close)
            self.handlers.setdefault(lt.name, []).append(HandlerSpec(lt, join.on_left, False))
            self.handlers.setdefault(rt.name, []).append(HandlerSpec(rt, join.on_right, False))
            return fn

        return register

    def on_late(self, table: Table | str) -> Callable[[F], F]:
        """Decorate ``fn(key, value, ctx, late)``: called for a record that joins no open
        window of ``table`` (``late``: the ``LateRecordError``, with ``start``, ``end`` and
        ``stream_time``), instead of sending it to the dead letters with reason ``late``."""
        t = self._windowed(table, "@app.on_late")

        def register(fn: F) -> F:
            _check_arity(fn, 4, "@app.on_late callback", "(key, value, ctx, late)")
            self.late_callbacks.setdefault(t.name, []).append(fn)
            return fn

        return register

    def processor(self, topic: Topic | str, *, concurrency: int = 1) -> Callable[[F], F]:
        """Decorate `fn(key, value, ctx)` (sync or async) to handle every record of `topic`.

        ``concurrency=N`` (async handlers): up to N records of different keys run at once,
        each key's records one after the other in offset order (records finish out of
        offset order; checkpoints record what finished, see `docs/design.md`)."""
        t = self._resolve_topic(topic)
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"@app.processor({t.name!r}): concurrency must be an integer >= 1, got {concurrency!r}")

        def register(fn: F) -> F:
            _check_arity(fn, 3, "@app.processor handler", "(key, value, ctx)")
            is_async = inspect.iscoroutinefunction(fn)
            if concurrency > 1 and not is_async:
                raise ValueError(
                    f"@app.processor({t.name!r}, concurrency={concurrency}): {fn.__qualname__} is not async; "
                    "only async handlers can run concurrently"
                )
            specs = self.handlers.setdefault(t.name, [])
            fed = [f.name for s in specs if isinstance(f := getattr(s.fn, "__self__", None), FedTable)]
            if fed and concurrency > 1:
                raise ValueError(
                    f"@app.processor({t.name!r}, concurrency={concurrency}): the topic feeds table {fed[0]!r}, "
                    "so its records are applied one at a time, in time order with the other inputs"
                )
            if specs and concurrency != specs[0].concurrency:
                raise ValueError(
                    f"@app.processor({t.name!r}): every handler of a topic needs the same concurrency "
                    f"({specs[0].name} has {specs[0].concurrency}, {fn.__qualname__} {concurrency})"
                )
            specs.append(HandlerSpec(t, fn, is_async, concurrency))
            return fn

        return register

    def on_keys_revoked(self, fn: F) -> F:
        """`fn(partitions)`: keys of these partitions may move away; flush their state.

        Called once per processor, with that processor's tables bound."""
        _check_arity(fn, 1, "@app.on_keys_revoked callback", "(partitions)")
        self.keys_revoked_callbacks.append(fn)
        return fn

    def on_keys_assigned(self, fn: F) -> F:
        """`fn(partitions)`: keys of these partitions are now ours; load their state."""
        _check_arity(fn, 1, "@app.on_keys_assigned callback", "(partitions)")
        self.keys_assigned_callbacks.append(fn)
        return fn

    def every(self, seconds: float) -> Callable[[F], F]:
        """Run `fn()` every `seconds` in each worker, or `fn(ctx)` once per hosted processor
        with its tables bound (ctx.processor, ctx.send)."""
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"@app.every needs a positive, finite interval in seconds, got {seconds!r}")

        def register(fn: F) -> F:
            n = len(inspect.signature(fn).parameters)
            if n not in (0, 1):
                raise TypeError(f"@app.every function {fn.__qualname__} must take () or (ctx)")
            self.timers.append(TimerSpec(seconds, fn, inspect.iscoroutinefunction(fn), n == 1))
            return fn

        return register

    # -- running ------------------------------------------------------------------------
    def run(self, members: int = 1, *, log_level: str = "INFO") -> None:
        """Run a worker of this app in this process until SIGTERM or Ctrl-C, as
        ``streamkit worker MODULE:APP`` does, so that ``python app.py`` runs it::

            if __name__ == "__main__":
                app.run()

        The broker is the app's (``App(broker=...)`` or ``STREAMKIT_BROKER``); a bad
        setting or no broker stops it with one line naming what was wrong."""
        # Imported when called: the App holds declarations and does not import the runtime.
        from importlib import import_module

        from streamkit.errors import StreamkitError

        try:
            import_module("streamkit.cli.worker").run_app(self, members, log_level=log_level)
        except StreamkitError as exc:
            raise SystemExit(f"error: {exc}") from None

    # -- derived facts ------------------------------------------------------------------
    @property
    def input_topics(self) -> list[str]:
        return sorted(self.handlers)

    @property
    def group_id(self) -> str:
        return f"streamkit-{self.name}"

    @property
    def dead_letter_topic(self) -> str:
        return self.settings.dead_letter_topic or f"{self.name}-dead-letters"

    @property
    def processor_count(self) -> int | None:
        """The initial processor count as configured (None: decided at first start)."""
        return self.settings.processors

    def store_path(self, processor: int, state_dir: Path | None = None) -> Path:
        return Path(state_dir or self.settings.state_dir) / self.name / f"processor-{processor}"

    def _resolve_topic(self, topic: Topic | str) -> Topic:
        if isinstance(topic, Topic):
            self.topics.setdefault(topic.name, topic)
            return topic
        return self.topics.get(topic) or self.topic(topic)


def _check_arity(fn: Callable[..., Any], n: int, what: str, shape: str) -> None:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    if not varargs and len(positional) != n:
        raise TypeError(f"{what} {getattr(fn, '__qualname__', fn)} must take {shape}")
