"""Mode 2: backfill the stores by replaying historical input records through the app's
own handlers (:func:`backfill_replay`)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stores.serde import RawSerde
from streamkit.app import App
from streamkit.connection import Connection
from streamkit.errors import ConfigError
from streamkit.joins import FedTable
from streamkit.spark import tasks
from streamkit.spark._deps import require
from streamkit.spark.global_load import load_global_tables
from streamkit.spark.inputs import load_source, wanted_columns
from streamkit.spark.job import _run
from streamkit.spark.keyless import KeylessInput
from streamkit.spark.options import BackfillOptions
from streamkit.spark.plan import (
    _check_columns,
    _common_checks,
    _prepare,
    _resolve_app,
    _spark,
    _value_expr,
)
from streamkit.spark.result import BackfillResult, Reporter
from streamkit.spark.shuffle import TaskCounters, _timed
from streamkit.spark.staging import Staging

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["backfill_replay"]


def backfill_replay(
    app: App | str,
    df: DataFrame | str,
    options: BackfillOptions | None = None,
    *,
    tables: Sequence[str] | None = None,
    order_by: str | Sequence[str] | None = None,
    timestamp_col: str | None = None,
    allow_timers: bool = False,
    **fields: Any,
) -> BackfillResult:
    """Mode 2: run the app's own handlers of ``topic`` over historical records.

    ``options`` (:class:`~.options.BackfillOptions`) say how to read the history, where
    the processors resume and how the job runs; ``fields`` name fields of it, over
    ``options`` (``backfill_replay(app, df, offset_col="offset", ...)``). ``tables``:
    the tables to build (default: all the app's).

    ``df`` may be a source string, checked and read as in :func:`backfill_state`. Rows
    left out (no key, a handler raised, undecodable) fail the run with samples unless
    ``allow_skipped``; then the result counts them in ``details["left_out"]``.

    ``df`` has one row per input record: key and value (decoded forms, encoded with
    the topic's serdes, or the record's bytes with ``key_encoded`` / ``value_encoded``),
    an ordering (``order_by``, default the partition and offset columns), and where known the
    partition, offset (resume positions: highest offset + 1 per partition) and
    timestamp (ms or a timestamp column; what ``ctx.timestamp`` and windowed tables
    see). Records are grouped by key (each key's state is built by one task), ordered,
    and replayed with :class:`streamkit.replay.Replayer`: no output is sent, and a
    handler that touches another key's state is refused with ``ReplayError``. Apps with
    per-processor timers are refused unless ``allow_timers`` (timers do not run here);
    rebalance callbacks do not run either (they move state, they should not make it).

    Several topics (``topic_col``: the column naming each record's topic; every input of
    the app): what an app with tables fed by topics or stream joins needs. Each record is
    encoded with its topic's serdes and runs its topic's handlers, and a key's records of
    all topics are applied in the order a worker's processor merges them (timestamp, then
    topic, partition and offset; within a partition, offset order: a record behind its
    partition's running largest timestamp goes with that largest one), so the stores equal
    a worker's that reads the same records.

    Global tables are read whole from their topics before the replay (``broker`` needed),
    and every record's lookups see them as they are then, as in a worker that starts now.

    Windowed tables: each record is applied with its processor's stream time
    (``with_stream_time``), so the records a worker judges late are late here too (left
    out and counted in ``details["late"]``), and each key's windows that the processor's
    final stream time closes are recorded closed (no callback); each store's checkpoint
    carries that stream time.
    """
    opts = (options or BackfillOptions()).over(fields, "backfill_replay")
    key_col, value_col, topic_col = opts.key_col, opts.value_col, opts.topic_col
    partition_col, offset_col = opts.partition_col, opts.offset_col
    F = require("pyspark.sql.functions")
    app_obj, app_ref = _resolve_app(app)
    topics = _replayed_topics(app_obj, opts.topic, topic_col, timestamp_col, opts.allow_partial)
    names = list(tables) if tables is not None else sorted(app_obj.tables)
    if not names:
        raise ConfigError(f"app {app_obj.name!r} has no table: nothing to backfill")
    _common_checks(app_obj, names, "replay", opts.allow_partial)
    stateful_timers = [t.fn for t in app_obj.timers if t.per_processor]
    if stateful_timers and not allow_timers:
        timer_names = ", ".join(getattr(f, "__qualname__", repr(f)) for f in stateful_timers)
        raise ConfigError(
            f"app {app_obj.name!r} has per-processor timers ({timer_names}) that run with its tables bound; the replay "
            "runs handlers only and cannot reproduce what timers do to state. Pass allow_timers=True "
            "if they do not change table state"
        )
    if order_by is None:
        if offset_col is None:
            raise ConfigError("give order_by (the ordering column(s) of each key's records) or offset_col")
        # a key of a topic that grew: its old partition's records first (linear hashing moves
        # a key only to a partition of a higher number), in offset order within each
        order_by = [offset_col] if partition_col is None else [partition_col, offset_col]
    order = [order_by] if isinstance(order_by, str) else list(order_by)
    if offset_col is not None and partition_col is None:
        raise ConfigError("offset_col needs partition_col (offsets are per partition)")
    if any(app_obj.tables[n].window is not None for n in names) and timestamp_col is None:
        raise ConfigError("a windowed table needs the records' timestamps: give timestamp_col")
    wanted = wanted_columns(
        topic_col=topic_col,
        key_col=key_col,
        value_col=value_col,
        order_by=order,
        timestamp_col=timestamp_col,
        partition_col=partition_col,
        offset_col=offset_col,
    )
    _check_columns(df, wanted, "the history")
    prep = _prepare(app_obj, opts, topics=topics, derive=offset_col is not None)
    broker = opts.broker
    globals_held = load_global_tables(
        app_obj, app_obj.connection(broker) if not isinstance(broker, Connection) else broker,
        prep.state_dir / app_obj.name / "backfill-global-tables",
    )  # fmt: skip
    spark = _spark(opts.spark)
    if isinstance(df, str):
        df = load_source(spark, df, opts.reader_options)
    _check_columns(df, wanted, "the history")
    plan = prep.plan(spark, opts, mode="replay", tables=names)
    plan.keyless_inputs[0] = KeylessInput(
        "the history",
        key_col,
        {"value": value_col if isinstance(value_col, str) else None, "ts": timestamp_col, "partition": partition_col,
         "offset": offset_col, "topic": topic_col, **{f"o{i}": c for i, c in enumerate(order)}},
    )  # fmt: skip
    sel = [F.col(key_col).alias("key"), _value_expr(F, value_col).alias("value")]
    if timestamp_col:
        sel.append(F.col(timestamp_col).alias("ts"))
    if partition_col:
        sel.append(F.col(partition_col).cast("int").alias("partition"))
    if offset_col:
        sel.append(F.col(offset_col).cast("long").alias("offset"))
    if topic_col:
        sel.append(F.col(topic_col).cast("string").alias("topic"))
    for i, c in enumerate(order):
        sel.append(F.col(c).alias(f"o{i}"))
    normalized = df.select(*sel)
    order_types = [normalized.schema[f"o{i}"].dataType.simpleString() for i in range(len(order))]
    t = app_obj.topics[topics[0]]
    merged = topic_col is not None  # several topics: each key's records in the merged order
    topic_serdes = tuple(
        (name, RawSerde() if opts.key_encoded else app_obj.topics[name].key_serde,
         RawSerde() if opts.value_encoded else app_obj.topics[name].value_serde)
        for name in (topics if merged else ())
    )  # fmt: skip
    app_pickle = None
    if app_ref is None:
        from pyspark import cloudpickle

        app_pickle = cloudpickle.dumps(app_obj)
    large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
    from streamkit.spark.workerpath import worker_pythonpath

    codecs = tuple(tasks.TableCodec(n, app_obj.tables[n].key_serde, app_obj.tables[n].value_serde) for n in names)
    windowed = any(app_obj.tables[n].window is not None for n in names)
    ddl = _REPLAY_A_DDL + "".join(f", _o{i} {ty}" for i, ty in enumerate(order_types))

    def build(staging: Staging, subs: int, n: int, sp_keys: list[int], counters: TaskCounters) -> DataFrame:
        spec = tasks.Spec(
            mode="replay",
            p0=plan.p0,
            p=plan.p,
            subs=subs,
            sst_root=str(staging.sst_root),
            large_binary=large,
            key_col="key",
            value_col="value",
            topic=topics[0],
            topic_col="topic" if merged else None,
            topic_serdes=topic_serdes,
            partition_col="partition" if partition_col else None,
            offset_col="offset" if offset_col else None,
            timestamp_col="ts" if timestamp_col else None,
            order_cols=tuple(f"o{i}" for i in range(len(order))),
            tables=codecs,
            app_ref=app_ref,
            app_pickle=app_pickle,
            sys_path=tuple(worker_pythonpath().split(":")),
            key_serde=RawSerde() if opts.key_encoded else t.key_serde,
            value_serde=RawSerde() if opts.value_encoded else t.value_serde,
            fail_at=opts.fail_at,
            extra={"sp_keys": sp_keys, "topics": topics if merged else [], "globals": globals_held},
        )
        placed = normalized.mapInArrow(functools.partial(_timed, tasks.place_replay, counters, 0, spec), ddl)
        ordering = [f"_o{i}" for i in range(len(order))]
        if windowed or merged:
            placed, finals = with_stream_time(
                placed, subs, spec.p, by_offset=offset_col is not None, order=len(order), finals=windowed
            )
            if windowed:
                plan.stream_times = finals
                spec = dataclasses.replace(spec, extra={**spec.extra, "stream_times": finals})
        if merged:  # a worker's merge, per key: by the partition's running largest timestamp, topic, offset
            ordering = ["_st", "_topic", "_part", "_off", *ordering]
        return (
            placed.repartition(n, "_sp")
            .withColumn("_h", F.xxhash64("_k"))  # a long to sort on first: Spark's prefix sort
            .sortWithinPartitions("_h", "_k", *ordering, "_part", "_off", "_v")
            .drop("_sp", "_h")
            .mapInArrow(functools.partial(tasks.write_replay, spec), tasks.META_DDL)
        )

    return _run(plan, spark, build, opts.reporter or Reporter())


def _replayed_topics(
    app: App, topic: str | None, topic_col: str | None, timestamp_col: str | None, allow_partial: bool
) -> list[str]:
    """The topics whose history the replay runs: ``topic`` alone, or, with ``topic_col``,
    every input of the app, merged in time order."""
    inputs = app.input_topics
    timed = sorted(t for t in inputs if app.handlers[t] and app.handlers[t][0].topic.timestamp is not None)
    if timed:
        raise ConfigError(
            f"app {app.name!r} takes its records' time from them on topic(s) {timed} (timestamp=): a replay "
            "orders and windows a history by its timestamp column, so it cannot build these stores yet"
        )
    if topic_col is not None:
        if topic is not None:
            raise ConfigError("give topic (a history of one topic) or topic_col (a column naming each row's topic)")
        if timestamp_col is None and len(inputs) > 1:
            raise ConfigError(
                f"app {app.name!r} consumes {inputs}: merging their histories in time order needs the "
                "records' timestamps (timestamp_col)"
            )
        unhandled = [t for t in inputs if t not in app.handlers]
        if unhandled:
            raise ConfigError(f"app {app.name!r} has no handler for topic(s) {unhandled}")
        return list(inputs)
    if topic is None:
        if len(inputs) != 1:
            raise ConfigError(
                f"app {app.name!r} consumes {inputs}: say which topic the history is of (topic=), or give a "
                "history of all of them with a column naming each row's topic (topic_col=)"
            )
        topic = inputs[0]
    if topic not in app.handlers:
        raise ConfigError(f"app {app.name!r} has no handler for topic {topic!r} (it handles {inputs})")
    fed = sorted(name for name, t in app.tables.items() if isinstance(t, FedTable))
    if fed or app.joins:
        what = f"tables fed by topics ({', '.join(fed)})" if fed else f"stream joins ({', '.join(sorted(app.joins))})"
        raise ConfigError(
            f"app {app.name!r} has {what}: replay the history of all its inputs together, with a column naming "
            "each row's topic (topic_col=), so that their records are merged in time order"
        )
    if not allow_partial and len(inputs) > 1:
        raise ConfigError(
            f"app {app.name!r} also consumes {[t for t in inputs if t != topic]}, whose history this replay "
            "does not include; pass allow_partial=True if their state may start empty, or replay all of them "
            "with topic_col="
        )
    return [topic]


def with_stream_time(
    placed: DataFrame, subs: int, processors: int, *, by_offset: bool, order: int, finals: bool = True
) -> tuple[DataFrame, dict[int, int]]:
    """``placed`` with ``_st``, each record's stream time: the largest timestamp among its
    processor's records of its partition up to it, in offset order (a worker's, where
    each processor reads one partition; without offsets, among its key's records in the
    history's order), and each processor's stream time at the end (its largest timestamp).

    Over several topics, ``_st`` is also where the record goes in its processor's merge
    of the topics: a worker takes the partitions' heads by smallest timestamp, so a record
    behind its partition's running largest timestamp follows its predecessor at once."""
    F = require("pyspark.sql.functions")
    Window = require("pyspark.sql.window").Window
    proc = F.floor(F.col("_b") / subs).cast("int")
    if by_offset:
        window = Window.partitionBy(proc, F.col("_topic"), F.col("_part")).orderBy("_off")
    else:
        window = Window.partitionBy("_b", "_k", "_topic").orderBy(*[f"_o{i}" for i in range(order)])
    running = window.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    ends = {}
    if finals:
        # one global aggregate, not a groupBy(proc): it keeps its partial step before the
        # shuffle whatever the session says of grouped ones (BYPASS_PARTIAL_AGGREGATION)
        (row,) = placed.agg(*[F.max(F.when(proc == q, F.col("_ts"))) for q in range(processors)]).collect()
        ends = {q: int(end) for q, end in enumerate(row) if end is not None}
    return placed.withColumn("_st", F.max("_ts").over(running)), ends


_REPLAY_A_DDL = "_sp int, _b int, _k binary, _v binary, _ts long, _topic string, _part int, _off long"
