"""Mode 1: backfill the stores from DataFrames of final state (:func:`backfill_state`)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from streamkit.app import App
from streamkit.errors import ConfigError
from streamkit.spark import tasks
from streamkit.spark._deps import require
from streamkit.spark.inputs import load_source, wanted_columns
from streamkit.spark.job import _run
from streamkit.spark.keyless import KeylessInput, counted
from streamkit.spark.options import BackfillOptions
from streamkit.spark.partitioning import hash_partitioned_by
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

__all__ = ["backfill_state", "backfill_table"]


def backfill_state(
    app: App | str,
    tables: Mapping[str, DataFrame | str],
    options: BackfillOptions | None = None,
    *,
    partitioned_by_key: bool | None = None,
    **fields: Any,
) -> BackfillResult:
    """Mode 1: write the stores from DataFrames of final state, ``{table: df}``.

    ``options`` (:class:`~.options.BackfillOptions`) say how to read the history, where
    the processors resume and how the job runs; ``fields`` name fields of it, over
    ``options`` (``backfill_state(app, tables, offset_col="offset", ...)``).

    A table's history may also be a source string (``parquet:PATH``, ``table:NAME``, a
    path: :mod:`.inputs`), read with ``reader_options``; a Parquet source's columns are
    checked before Spark starts. Everything that needs no Spark is checked first
    (arguments, columns, positions against the cluster, processor counts, whether a
    worker holds the stores: :func:`._prepare`); rows without a key are refused unless
    ``allow_skipped`` (then left out and counted in ``details["left_out"]``).

    Each DataFrame holds ``(key, value)`` rows (``value_col`` may name several columns,
    which become a struct / JSON object). Keys and values are encoded with the table's
    serdes (or taken as stored bytes with ``key_encoded`` / ``value_encoded``); a null
    value means "no state". Resume positions: ``positions`` (``{(topic, part): next}``
    or ``["topic:part=next", ...]``) and/or an offset column (with ``partition_col`` and
    ``topic_col`` or ``topic``), from which each partition's position is its highest
    offset + 1 and duplicate keys resolve to the highest offset.

    ``partitioned_by_key=True`` says every key's rows are in one partition of each
    DataFrame (true of the output of ``groupBy(key)``, ``repartition(key)``): the job then
    skips its own shuffle and sort (each task sorts its partition in Arrow, in memory)
    and the built stores are checked to hold every written key exactly once. The default
    (None) takes that path when Spark's plan hash-partitions every DataFrame by its key
    column (:mod:`.partitioning`), and shuffles otherwise; False always shuffles.
    """
    opts = (options or BackfillOptions()).over(fields, "backfill_state")
    key_col, value_col, topic, topic_col = opts.key_col, opts.value_col, opts.topic, opts.topic_col
    partition_col, offset_col, fail_at = opts.partition_col, opts.offset_col, opts.fail_at
    F = require("pyspark.sql.functions")
    app_obj, _ = _resolve_app(app)
    names = list(tables)
    if not names:
        raise ConfigError("no table to backfill")
    _common_checks(app_obj, names, "state", opts.allow_partial)
    for name in names:
        if app_obj.tables[name].window is not None:
            raise ConfigError(
                f"table {name!r} is windowed; backfill from final state supports plain tables only "
                "(replay the history with backfill_replay instead)"
            )
    if offset_col is not None and partition_col is None:
        raise ConfigError("offset_col needs partition_col (and topic_col or topic)")
    if offset_col is not None and topic_col is None and topic is None:
        inputs = app_obj.input_topics
        if len(inputs) != 1:
            raise ConfigError(f"offset_col needs topic= or topic_col (app consumes {inputs})")
        topic = inputs[0]
    wanted = wanted_columns(
        key_col=key_col if isinstance(key_col, str) else None,
        value_col=value_col,
        topic_col=topic_col,
        partition_col=partition_col,
        offset_col=offset_col,
    )
    for name in names:
        _check_columns(tables[name], wanted, f"the history of table {name!r}")
    prep = _prepare(app_obj, opts, topics=app_obj.input_topics, derive=offset_col is not None)
    spark = _spark(opts.spark)
    plan = prep.plan(spark, opts, mode="state", tables=names)
    normalized: list[DataFrame] = []
    for name in names:
        source = tables[name]
        df = load_source(spark, source, opts.reader_options) if isinstance(source, str) else source
        _check_columns(df, wanted, f"the history of table {name!r}")
        plan.keyless_inputs[len(normalized)] = KeylessInput(
            f"the history of table {name!r}",
            key_col,
            {"value": value_col if isinstance(value_col, str) else None, "topic": topic_col,
             "partition": partition_col, "offset": offset_col},
        )  # fmt: skip
        sel = [F.col(key_col).alias("key"), _value_expr(F, value_col).alias("value")]
        if topic_col:
            sel.append(F.col(topic_col).cast("string").alias("topic"))
        if partition_col:
            sel.append(F.col(partition_col).cast("int").alias("partition"))
        if offset_col:
            sel.append(F.col(offset_col).cast("long").alias("offset"))
        normalized.append(df.select(*sel))
    if partitioned_by_key is None:
        partitioned_by_key = all(hash_partitioned_by(df, "key") for df in normalized)
    codecs = tuple(
        tasks.TableCodec(
            n, app_obj.tables[n].key_serde, app_obj.tables[n].value_serde, opts.key_encoded, opts.value_encoded
        )
        for n in names
    )
    large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"

    def build(staging: Staging, subs: int, n: int, sp_keys: list[int], counters: TaskCounters) -> DataFrame:
        spec = tasks.Spec(
            mode="state",
            p0=plan.p0,
            p=plan.p,
            subs=subs,
            sst_root=str(staging.sst_root),
            large_binary=large,
            key_col="key",
            value_col="value",
            topic=topic,
            topic_col="topic" if topic_col else None,
            partition_col="partition" if partition_col else None,
            offset_col="offset" if offset_col else None,
            tables=codecs,
            fail_at=fail_at,
            extra={"sp_keys": sp_keys},
        )
        if partitioned_by_key:
            spec = dataclasses.replace(spec, extra={**spec.extra, "fused": True})
            metas = [
                df.mapInArrow(
                    functools.partial(counted, tasks.fused_state, counters.keyless, i, "key", spec, i), tasks.META_DDL
                )
                for i, df in enumerate(normalized)
            ]
            return functools.reduce(lambda x, y: x.unionByName(y), metas)
        staged = None
        for i, df in enumerate(normalized):
            out = df.mapInArrow(functools.partial(_timed, tasks.place_state, counters, i, spec, i), _STATE_A_DDL)
            staged = out if staged is None else staged.unionByName(out)
        assert staged is not None
        return (
            staged.repartition(n, "_sp")
            .sortWithinPartitions("_b", "_t", "_k", "_off")
            .drop("_sp")
            .mapInArrow(functools.partial(tasks.write_state, spec), tasks.META_DDL)
        )

    plan.verify_unique = partitioned_by_key
    return _run(plan, spark, build, opts.reporter or Reporter())


def backfill_table(
    app: App | str,
    table: str,
    df: DataFrame,
    options: BackfillOptions | None = None,
    *,
    partitioned_by_key: bool | None = None,
    **fields: Any,
) -> BackfillResult:
    """Mode 1 for one table: ``backfill_state(app, {table: df}, options, ...)``."""
    return backfill_state(app, {table: df}, options, partitioned_by_key=partitioned_by_key, **fields)


_STATE_A_DDL = "_sp int, _b int, _t int, _k binary, _v binary, _topic string, _part int, _off long"
