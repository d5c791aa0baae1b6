"""Backfill an app's stores from Spark: the driver side of both modes.

Mode 1, :func:`backfill_state`: a DataFrame of final state, ``(key, value)`` rows per
table. Mode 2, :func:`backfill_replay`: a DataFrame of historical input records; the
app's own handlers run over each key's records in order (``streamkit.replay``).

Both run one Spark job::

    input --mapInArrow(stage A: encode, hash, place)--> repartition(bucket)
          --sortWithinPartitions(bucket, key, order)--> mapInArrow(stage B: SSTs) --> collect

then, on the driver, ingest each processor's SST files into a fresh store stamped with
the checkpoint positions, and publish all stores atomically (:mod:`.staging`).

The code lives in: :mod:`.options` (the options both modes share), :mod:`.plan` (shared
set-up and checks), :mod:`.state_mode` (mode 1), :mod:`.replay_mode` (mode 2),
:mod:`.shuffle` (spreading buckets over Spark partitions), :mod:`.job` (the Spark job,
building and publishing the stores), :mod:`.positions` (resume positions and which
stores they are stamped into) and :mod:`.result`.
This module re-exports the public names.
"""

from __future__ import annotations

from streamkit.spark.options import BackfillOptions
from streamkit.spark.positions import parse_positions
from streamkit.spark.replay_mode import backfill_replay
from streamkit.spark.result import BackfillResult, Reporter
from streamkit.spark.shuffle import spark_partition_keys
from streamkit.spark.state_mode import backfill_state, backfill_table

__all__ = [
    "BackfillOptions",
    "BackfillResult",
    "Reporter",
    "backfill_replay",
    "backfill_state",
    "backfill_table",
    "parse_positions",
    "spark_partition_keys",
]

# also kept importable from here (tests, benchmarks): _murmur3_int, _timed, _STATE_A_DDL, _REPLAY_A_DDL, Positions
