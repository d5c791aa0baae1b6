"""The code that runs inside Spark tasks (Python workers), one function per stage.

Stage A (``place_*``, narrow, before the shuffle): encode keys and values with the
serdes, hash the key bytes, compute processor and bucket (vectorised). Stage B
(``write_*``, after ``repartition(bucket)`` + ``sortWithinPartitions``): every bucket's
rows arrive together, sorted by key; write one SST per (bucket, table) into the
run's staging directory, and return one metadata row per file (plus position and
statistics rows) to the driver. Mode 2's stage B runs the app's own handlers over
each key's records (``streamkit.replay.Replayer``), in the order of the ordering
columns, and writes the resulting state.

Everything here is importable without pyspark (only the ``TaskContext`` lookup needs
it, and only inside a task), so the same functions also run in-process in tests.

The code lives in :mod:`.task_spec` (the shared contract), :mod:`.task_place` (stage A),
:mod:`.task_write_state` and :mod:`.task_write_replay` (stage B of each mode) and
:mod:`.task_output` (what every stage B task hands back: SST files, offsets, timings);
this module re-exports it.
"""

from __future__ import annotations

from streamkit.spark.task_output import Clocked
from streamkit.spark.task_place import place_replay, place_state
from streamkit.spark.task_spec import (
    ERROR_END,
    ERROR_MARK,
    META_DDL,
    META_SCHEMA,
    Spec,
    TableCodec,
    TaskError,
)
from streamkit.spark.task_write_replay import load_spec_app, write_replay
from streamkit.spark.task_write_state import fused_state, write_state

__all__ = [
    "ERROR_END",
    "ERROR_MARK",
    "META_DDL",
    "META_SCHEMA",
    "Clocked",
    "Spec",
    "TableCodec",
    "TaskError",
    "fused_state",
    "load_spec_app",
    "place_replay",
    "place_state",
    "write_replay",
    "write_state",
]
