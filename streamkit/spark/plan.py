"""The shared set-up of both modes: resolving the app, the processor counts, the
layout of the job, input checks, and the ``BackfillPlan`` the driver runs."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamkit.app import App
from streamkit.connection import Connection
from streamkit.errors import ConfigError
from streamkit.spark._deps import require
from streamkit.spark.backfill_plan import BackfillPlan
from streamkit.spark.options import BackfillOptions
from streamkit.spark.workerpath import app_ref

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

    from streamkit.spark.preflight import ClusterView


def _layout(spark: SparkSession, p: int, num_partitions: int | None, subs: int | None) -> tuple[int, int]:
    par = max(1, spark.sparkContext.defaultParallelism)
    target = max(2 * par, p)
    if subs is None:
        subs = max(1, math.ceil(target / p))
    n = num_partitions or min(p * subs, max(target, p))
    return subs, n


def _resolve_app(app: App | str) -> tuple[App, str | None]:
    if isinstance(app, str):
        from streamkit.loader import load_app

        return load_app(app), app
    if not isinstance(app, App):
        raise TypeError(f"expected a streamkit.App or 'module:attr', got {type(app).__name__}")
    return app, app_ref(app)


def _counts(
    app: App, p0: int | None, processors: int | None, view: ClusterView | None
) -> tuple[int, int, int, list[str]]:
    """The job's initial processor count p0, the count p the stores are built for, and the
    first processor to build, checked against (and recorded in) the cluster when a broker
    is known: placement of every key depends on p0, so a backfill made for one p0 must
    never be opened by a job running another. p0 defaults as a worker's first start does
    (the app's ``processors``, else the first input topic's initial partition count). A
    job recorded with fewer processors than p keeps its processors' stores: only those of
    the processors that do not exist yet are built (``streamkit scale`` bootstraps them
    from there)."""
    notes: list[str] = []
    running: int | None = None
    configured = p0 if p0 is not None else app.processor_count
    if view is None:
        if configured is None:
            raise ConfigError(
                f"app {app.name!r} does not fix its processor count (processors=None: decided at first "
                "start); pass p0= with the job's initial processor count, or broker= to read it"
            )
        notes.append(
            f"p0={configured} was not checked against the cluster (no broker given): start the job with "
            f"processors={configured}"
        )
        p0 = configured
    elif view.job_p0 is not None:
        if configured is not None and configured != view.job_p0:
            raise ConfigError(
                f"job {app.name!r} was created with {view.job_p0} processors; this backfill uses "
                f"p0={configured}: a backfill must use the job's initial processor count"
            )
        p0, running = view.job_p0, view.job_p
    else:
        first_topic = view.topics[app.input_topics[0]]
        p0 = configured if configured is not None else first_topic.n0
        if configured is None:
            notes.append(
                f"p0={p0}: the initial partition count of {first_topic.topic} (the job had not started; "
                "its workers will use the same)"
            )
    p = processors if processors is not None else p0
    if p0 < 1 or p < p0:
        raise ConfigError(f"processor counts must satisfy 1 <= p0 <= processors, got p0={p0}, processors={p}")
    first = 0
    if running is not None and running < p:
        first = running
        notes.append(
            f"job {app.name!r} runs {running} processors: only the stores of processors {first}..{p - 1} are "
            f"built (the others are left as they are); streamkit scale --processors {p} bootstraps them from there"
        )
    return int(p0), int(p), first, notes


def _record_job(view: ClusterView, app: App, p0: int) -> str:
    """Write the job's first record (as its first worker would) if it has none: its
    workers must then agree with the p0 the stores were built for. Returns the job's
    incarnation (stamped into the stores)."""
    if view.job_p0 is not None:
        return view.job_incarnation
    import asyncio

    from streamkit.kafkaio import KafkaIO
    from streamkit.runtime.jobmeta import resolve_job

    async def record() -> str:
        async with KafkaIO(view.connection) as io:
            job = await resolve_job(io, app.name, p0, p0, tuple(app.input_topics))
        if job.p0 != p0:  # a worker started meanwhile with another count
            raise ConfigError(f"job {app.name!r} was just started with {job.p0} processors, not p0={p0}: run again")
        return job.incarnation

    return asyncio.run(record())


@dataclass
class _Prepared:
    """What the checks before Spark decided, for the app and topics they checked."""

    app: App
    topics: list[str]
    state_dir: Path
    from_start: bool
    derive: bool
    p0: int
    p: int
    first: int
    notes: list[str]
    positions: dict[tuple[str, int], int]
    cluster: ClusterView | None
    layout_epochs: dict[str, int]
    topic_partitions: dict[str, tuple[int, int]]
    incarnation: str = ""

    def plan(self, spark: SparkSession, options: BackfillOptions, *, mode: str, tables: list[str]) -> BackfillPlan:
        """The plan the driver runs, laid out over ``spark``'s parallelism."""
        subs_, nparts = _layout(spark, self.p, options.num_partitions, options.subs)
        return BackfillPlan(
            app=self.app,
            mode=mode,
            tables=tables,
            p0=self.p0,
            p=self.p,
            subs=subs_,
            num_partitions=nparts,
            state_dir=self.state_dir,
            positions=self.positions,
            derive_positions=self.derive,
            topics=self.topics,
            layout_epochs=self.layout_epochs,
            allow_partial=options.allow_partial,
            from_start=self.from_start,
            fail_at=options.fail_at,
            keep_backup=options.keep_backup,
            topic_partitions=self.topic_partitions,
            notes=self.notes,
            first=self.first,
            cluster=self.cluster,
            allow_skipped=options.allow_skipped,
            incarnation=self.incarnation,
        )


def _prepare(app: App, options: BackfillOptions, *, topics: Sequence[str], derive: bool) -> _Prepared:
    """The checks that need no Spark, in order, before anything is written: positions
    given at all, the cluster's view of them (when a broker is known), the processor
    counts, the live stores free; then the job's first record."""
    from streamkit.spark.positions import _layouts, parse_positions
    from streamkit.spark.preflight import check_given_positions, read_cluster
    from streamkit.spark.staging import check_stores_free

    from_start, broker = options.from_start, options.broker
    given = parse_positions(options.positions)
    if not given and not derive and not from_start:
        raise ConfigError(
            "no resume positions: give positions (TOPIC:PARTITION=NEXT_OFFSET) or the history's offset column "
            "(offset_col + partition_col), or from_start=True if none of the history is in Kafka"
        )
    connection = broker if isinstance(broker, Connection) else app.connection(broker)
    view = read_cluster(connection, app.name, app.input_topics) if connection is not None else None
    p0_, p, first, notes = _counts(app, options.p0, options.processors, view)
    epochs = dict(options.layout_epochs or {})
    layouts = _layouts(options.topic_partitions)
    if view is not None:
        given = check_given_positions(given, view, topics, from_start=from_start, derive=derive)
        epochs = {**view.layout_epochs(), **epochs}
        layouts = {**{t: v for t, v in view.topic_partitions().items() if t in topics}, **layouts}
    else:
        notes.append("positions were not checked against a cluster (no broker given)")
    state_dir = Path(options.state_dir or app.settings.state_dir).absolute()
    check_stores_free(state_dir / app.name, range(first, p), below=first)
    incarnation = _record_job(view, app, p0_) if view is not None else ""
    return _Prepared(
        app,
        list(topics),
        state_dir,
        from_start,
        derive,
        p0_,
        p,
        first,
        notes,
        given,
        view,
        epochs,
        layouts,
        incarnation,
    )


def _value_expr(F: Any, value_col: str | Sequence[str]) -> Column:
    if isinstance(value_col, str):
        if "," in value_col:
            value_col = [c.strip() for c in value_col.split(",") if c.strip()]
        else:
            return F.col(value_col)
    return F.struct(*[F.col(c) for c in value_col])


def _check_columns(history: Any, wanted: Mapping[str, list[str]], what: str) -> None:
    """Refuse a history (a source string or a DataFrame) without the columns the
    parameters name; a Parquet source is checked from its footer, without Spark."""
    from streamkit.spark.inputs import column_errors, history_columns

    have = history_columns(history)
    if have is None:
        return  # known once Spark reads it
    errors = column_errors(have, wanted, what)
    if errors:
        raise ConfigError("; ".join(errors))


def _common_checks(app: App, tables: Sequence[str], mode: str, allow_partial: bool) -> None:
    for name in tables:
        if name not in app.tables:
            raise ConfigError(f"app {app.name!r} has no table {name!r} (tables: {sorted(app.tables)})")
    if not allow_partial:
        others = sorted(set(app.tables) - set(tables))
        if others:
            raise ConfigError(
                f"app {app.name!r} also has table(s) {others}, which this backfill would leave empty while "
                "the processors resume after the history; backfill them too, or pass allow_partial=True"
            )


def _spark(spark: SparkSession | Callable[[], SparkSession] | None) -> SparkSession:
    """The session to run in: given, made by a given factory (the CLI's, whose JVM output
    goes to a log file), or a :func:`~streamkit.spark.session.local_session`."""
    require("pyspark")
    require("pyarrow")
    from streamkit.spark.session import check_session, local_session

    if spark is None:
        return local_session()
    if callable(spark):
        return spark()
    check_session(spark)
    return spark
