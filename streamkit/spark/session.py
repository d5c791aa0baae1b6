"""A local SparkSession that works out of the box for the bridge, and checks for user sessions.

Pitfalls handled here:

- Python workers must run the driver's interpreter (the one with streamkit, pyarrow,
  rocksdict): ``PYSPARK_PYTHON`` / ``spark.pyspark.python`` = ``sys.executable``.
- Workers must import the user's app module: the driver's ``sys.path`` is exported as
  ``PYTHONPATH`` to the workers (and each mode 2 task re-adds it before loading the app).
- Bind to loopback (``spark.driver.host`` / ``bindAddress`` = 127.0.0.1): no DNS lookup
  of the host name, no listening on external interfaces.
- No UI, small shuffle partition counts, Arrow batches of a useful size.
- An aggregation is one step after its shuffle (:data:`BYPASS_PARTIAL_AGGREGATION`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from streamkit.spark._deps import require
from streamkit.spark.workerpath import worker_pythonpath

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

__all__ = ["BYPASS_PARTIAL_AGGREGATION", "check_session", "local_session"]

ARROW_BATCH_ROWS = 65536

BYPASS_PARTIAL_AGGREGATION = "spark.sql.execution.bypassPartialAggregation"
"""Spark 4.3's switch (default off) that plans an aggregation as one step after the
shuffle, without the partial aggregation before it. On in the bridge's local session:
what mode 1 is given is usually a ``groupBy(key)`` into millions of keys, where the
partial aggregation's hash map (a million keys in each task) costs more than the
shuffle it saves. Measured on 2 cores, Spark's aggregation alone: 5M events into 1M keys
4.5-5.5 s with it against 7.0-7.7 s without; 50M events into 1M keys 35-39 s against
41-48 s. An aggregation into few groups loses a great deal (every row is shuffled): pass
``conf={BYPASS_PARTIAL_AGGREGATION: "false"}`` when the session is made for such jobs
(``distinct`` and ``dropDuplicates`` count: they are grouped aggregations). The bridge's
own aggregation over a whole history (each processor's last stream time) is a global one,
which keeps its partial step. Older Sparks ignore the setting."""

_SETTING = threading.RLock()


@contextmanager
def session_setting(session: Any, key: str, value: str) -> Iterator[None]:
    """``key`` set to ``value`` in ``session`` for the block (and restored after it), for a
    plan made in the block: the bridge's, for an instant (a job run in it would hold every
    other block of the process, and the setting would apply to any other thread's plans).
    Two blocks of this process never interleave their changes (another thread's waits; a
    block nested in the same thread goes on)."""
    with _SETTING:
        before = session.conf.get(key, None)
        session.conf.set(key, value)
        try:
            yield
        finally:
            if before is None:
                session.conf.unset(key)
            else:
                session.conf.set(key, before)


def local_session(
    cores: int = 2,
    *,
    app_name: str = "streamkit-backfill",
    shuffle_partitions: int | None = None,
    max_task_failures: int = 1,
    conf: Mapping[str, Any] | None = None,
    log_level: str = "ERROR",
    driver_memory: str | None = "2g",
) -> SparkSession:
    """Get or create a local SparkSession configured for the bridge.

    ``max_task_failures`` > 1 makes local mode retry failed tasks (``local[N,F]``),
    which is what a cluster does. If a session already exists it is returned as is
    (after :func:`check_session`). Either way the ``streamkit`` data source is
    registered (``spark.read.format("streamkit")``).
    """
    require("pyarrow")
    pyspark_sql = require("pyspark.sql")
    SparkSession = pyspark_sql.SparkSession
    active = SparkSession.getActiveSession()
    if active is not None:
        check_session(active)
        _register_source(active)
        return active
    exe = sys.executable
    os.environ["PYSPARK_PYTHON"] = exe
    os.environ["PYSPARK_DRIVER_PYTHON"] = exe
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    path = worker_pythonpath()
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = path if not old else old + os.pathsep + path
    master = f"local[{cores}]" if max_task_failures <= 1 else f"local[{cores},{max_task_failures}]"
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.pyspark.python", exe)
        .config("spark.pyspark.driver.python", exe)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions or max(2, cores * 2)))
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(ARROW_BATCH_ROWS))
        .config("spark.python.worker.reuse", "true")
        .config("spark.executorEnv.PYTHONPATH", path)
        .config("spark.sql.session.timeZone", "UTC")
        .config(BYPASS_PARTIAL_AGGREGATION, "true")  # a backfill's groupBy(key): see the constant
    )
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    for k, v in (conf or {}).items():
        builder = builder.config(k, str(v))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    _register_source(spark)
    return spark


def _register_source(spark: SparkSession) -> None:
    """``spark.read.format("streamkit")`` works in every session the bridge hands out."""
    from streamkit.spark.source import register

    register(spark)


def check_session(spark: SparkSession) -> list[str]:
    """Warn about a session whose Python workers would not run this interpreter.

    Returns the warnings (also logged). The bridge still runs: another interpreter
    works if it has the same packages, but a mismatch is the usual cause of
    ``ModuleNotFoundError`` inside tasks.
    """
    warnings: list[str] = []
    sc = spark.sparkContext
    exec_ = getattr(sc, "pythonExec", None)
    if exec_ and os.path.realpath(exec_) != os.path.realpath(sys.executable):
        warnings.append(
            f"Spark's Python workers run {exec_!r}, not this interpreter {sys.executable!r}; "
            "set PYSPARK_PYTHON (or spark.pyspark.python) to it before the session starts"
        )
    # Later Python functions carry sc.environment: let them import the app's module.
    env = getattr(sc, "environment", None)
    if isinstance(env, dict) and "PYTHONPATH" not in env:
        env["PYTHONPATH"] = worker_pythonpath()
    for w in warnings:
        log.warning(w)
    return warnings
