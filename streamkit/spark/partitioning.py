"""Whether Spark already holds every row of a key in one partition of a DataFrame.

The output of ``groupBy(key)`` (a final-state aggregation, what mode 1 is usually given)
or of ``repartition(key)`` is hash-partitioned by the key: mode 1 can then place, sort
and write each partition where it is, without a shuffle and sort of its own (the
``partitioned_by_key`` path). Spark's physical plan says so (its output partitioning);
this reads it. The stores built that way are still checked to hold every key once.
"""

from __future__ import annotations

import logging
from typing import Any

from streamkit.spark.session import session_setting

log = logging.getLogger(__name__)

__all__ = ["hash_partitioned_by"]


def hash_partitioned_by(df: Any, column: str) -> bool:
    """True if ``df``'s physical plan hash-partitions it by ``column`` alone (False when
    it cannot tell: another partitioning, another engine, a plan it cannot read).

    The plan is read with adaptive execution off (for the instant of planning: its plan
    has no exchanges until it runs). What adaptive execution does at run time keeps an
    aggregation's or a repartition's partitions whole (it only coalesces them), but it may
    split a join's or a rebalance's skewed ones, so a plan with either is not trusted.
    Each partition is then sorted in memory by its task (as ``partitioned_by_key=True``)."""
    try:
        with session_setting(df.sparkSession, _ADAPTIVE, "false"):
            plan = df.select("*")._jdf.queryExecution().executedPlan()  # a new plan, made now
        partitioning = plan.outputPartitioning()
        text = plan.toString()
        if partitioning.getClass().getSimpleName() != "HashPartitioning" or "Join" in text or "REBALANCE" in text:
            return False
        exprs = partitioning.expressions()
        if exprs.size() != 1:
            return False
        expr = exprs.apply(0)
        return bool(expr.getClass().getSimpleName() == "AttributeReference" and expr.name() == column)
    except Exception as exc:  # noqa: BLE001 - Py4J errors, a Spark Connect DataFrame without _jdf
        log.debug("the DataFrame's partitioning could not be read: %s", exc)
        return False


_ADAPTIVE = "spark.sql.adaptive.enabled"
