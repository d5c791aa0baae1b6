"""The shared set-up of both modes: resolving the app, the processor counts, the
layout of the job, input checks, and the :class:`_Plan` the driver runs."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamkit.app import App
from streamkit.errors import ConfigError
from streamkit.spark._deps import require

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


@dataclass
class _Plan:
    """The shared part of both modes (what the driver needs to run and publish)."""

    app: App
    mode: str
    tables: list[str]  # tables written
    p0: int
    p: int
    subs: int
    num_partitions: int
    state_dir: Path
    positions: dict[tuple[str, int], int]
    derive_positions: bool
    topics: list[str]  # topics the positions must cover
    layout_epochs: dict[str, int]
    allow_partial: bool
    from_start: bool
    fail_at: str | None
    keep_backup: bool
    topic_partitions: dict[str, tuple[int, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    verify_unique: bool = False  # fused mode 1: check that no key was written twice
    first: int = 0
    """The first processor whose store is built (those below belong to a running job)."""


def _layout(spark: SparkSession, p: int, num_partitions: int | None, subs: int | None) -> tuple[int, int]:
    par = max(1, spark.sparkContext.defaultParallelism)
    target = max(2 * par, p)
    if subs is None:
        subs = max(1, math.ceil(target / p))
    n = num_partitions or min(p * subs, max(target, p))
    return subs, n


def _find_ref(app: App) -> str | None:
    """``module:attr`` under which ``app`` is importable (not ``__main__``)."""
    for name, module in list(sys.modules.items()):
        if module is None or name == "__main__" or name.startswith(("pyspark", "py4j", "numpy", "pandas")):
            continue
        try:
            attrs = vars(module)
        except TypeError:
            continue
        for attr, value in list(attrs.items()):
            if value is app:
                return f"{name}:{attr}"
    return None


def _resolve_app(app: App | str) -> tuple[App, str | None]:
    if isinstance(app, str):
        from streamkit.loader import load_app

        return load_app(app), app
    if not isinstance(app, App):
        raise TypeError(f"expected a streamkit.App or 'module:attr', got {type(app).__name__}")
    return app, _find_ref(app)


def _counts(app: App, p0: int | None, processors: int | None, broker: str | None) -> tuple[int, int, int, list[str]]:
    """The job's initial processor count p0, the count p the stores are built for, and the
    first processor to build, checked against (and recorded in) the cluster when a broker
    is known: placement of every key depends on p0, so a backfill made for one p0 must
    never be opened by a job running another. A job recorded with fewer processors than
    p keeps its processors' stores: only those of the processors that do not exist yet
    are built (``streamkit scale`` bootstraps them from there)."""
    notes: list[str] = []
    running: int | None = None
    bootstrap = broker or app.settings.broker
    configured = p0 if p0 is not None else app.processor_count
    if bootstrap is None:
        if configured is None:
            raise ConfigError(
                f"app {app.name!r} does not fix its processor count (processors=None: decided at first "
                "start); pass p0= (CLI: --p0) with the job's initial processor count, or broker= to read it"
            )
        notes.append(
            f"p0={configured} was not checked against the cluster (no broker given): start the job with "
            f"processors={configured}"
        )
        p0 = configured
    else:
        import asyncio

        from streamkit.errors import JobMismatchError
        from streamkit.kafkaio import KafkaIO
        from streamkit.runtime.jobmeta import JobLayout, read_job, resolve_job

        async def recorded() -> JobLayout | None:
            async with KafkaIO(bootstrap) as io:
                return await read_job(io, app.name)

        async def resolve(configured: int) -> JobLayout:
            async with KafkaIO(bootstrap) as io:
                return await resolve_job(io, app.name, configured, configured)

        try:
            if configured is None:
                job = asyncio.run(recorded())
                if job is None:
                    raise ConfigError(
                        f"job {app.name!r} has not started yet and does not fix its processor count; "
                        "pass p0= (CLI: --p0)"
                    )
            else:
                # records p0 for a job that has not started yet: its workers must then agree
                job = asyncio.run(resolve(configured))
            p0, running = job.p0, job.p
        except JobMismatchError as exc:
            message = str(exc).split(". The initial")[0].replace("this worker is configured with", "this backfill uses")
            raise ConfigError(f"{message}; a backfill must use the job's initial processor count") from None
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - unreachable broker etc.: one line
            raise ConfigError(
                f"cannot check the job's processor count at {bootstrap}: {type(exc).__name__}: {exc}"
            ) from None
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


def _value_expr(F: Any, value_col: str | Sequence[str]) -> Column:
    if isinstance(value_col, str):
        if "," in value_col:
            value_col = [c.strip() for c in value_col.split(",") if c.strip()]
        else:
            return F.col(value_col)
    return F.struct(*[F.col(c) for c in value_col])


def _check_columns(df: DataFrame, names: Sequence[str | None], what: str) -> None:
    have = set(df.columns)
    missing = [n for n in names if n is not None and n not in have]
    if missing:
        raise ConfigError(f"{what}: column(s) {missing} not found; the DataFrame has {sorted(have)}")


def _common_checks(app: App, tables: Sequence[str], mode: str, allow_partial: bool) -> None:
    for name in tables:
        if name not in app.tables:
            raise ConfigError(f"app {app.name!r} has no table {name!r} (tables: {sorted(app.tables)})")
    if not allow_partial:
        others = sorted(set(app.tables) - set(tables))
        if others:
            raise ConfigError(
                f"app {app.name!r} also has table(s) {others}, which this backfill would leave empty while "
                "the processors resume after the history; backfill them too, or pass allow_partial=True "
                "(CLI: --allow-partial)"
            )


def _spark(spark: SparkSession | None) -> SparkSession:
    require("pyspark")
    require("pyarrow")
    from streamkit.spark.session import check_session, local_session

    if spark is None:
        return local_session()
    check_session(spark)
    return spark
