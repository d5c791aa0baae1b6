"""What a backfill returns (:class:`BackfillResult`) and its progress hooks (:class:`Reporter`)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("streamkit.spark.backfill")

__all__ = ["BackfillResult", "Reporter"]


@dataclass
class BackfillResult:
    """What a backfill did (the CLI prints it as the summary)."""

    app: str
    mode: str
    tables: list[str]
    p0: int
    processors: int
    rows_read: int
    keys_written: dict[str, int]
    stores_published: int
    store_paths: list[str]
    positions: dict[tuple[str, int], int]
    run_id: str
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def keys_total(self) -> int:
        return sum(self.keys_written.values())


class Reporter:
    """Progress hooks (no-op here; the CLI draws them). ``phase`` wraps each step."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str, description: str = "") -> Iterator[None]:
        t0 = time.perf_counter()
        self.started(name, description)
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            self.timings[name] = self.timings.get(name, 0.0) + dt
            self.finished(name, dt)

    def started(self, name: str, description: str) -> None:
        log.info("backfill: %s%s", name, f" ({description})" if description else "")

    def finished(self, name: str, seconds: float) -> None:
        log.info("backfill: %s done in %.2fs", name, seconds)

    def spark_job(self, spark: SparkSession, group: str) -> None:
        """Called right before the Spark job of job group ``group`` starts."""

    def spark_job_done(self, ok: bool) -> None:
        """Called right after the Spark job finishes (``ok``) or fails."""
