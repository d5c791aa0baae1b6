"""The options both backfill modes share (:class:`BackfillOptions`): how the history's
columns are read, where the processors resume, the processor counts, the cluster and
the state directory, and how the job runs. The CLI builds one from its flags; from
Python, give one to :func:`~.state_mode.backfill_state` / :func:`~.replay_mode.backfill_replay`
or name its fields as keywords of those functions."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamkit.connection import Connection
    from streamkit.spark.result import Reporter

__all__ = ["BackfillOptions"]


@dataclass(frozen=True)
class BackfillOptions:
    """The options of a backfill, either mode (each mode's own arguments are its function's)."""

    # -- the history's columns -----------------------------------------------------------
    key_col: str = "key"
    value_col: str | Sequence[str] = "value"
    """A column (the value itself), or several (``"a,b,c"`` or a list): an object of them."""
    key_encoded: bool = False
    """The key column already holds the bytes: a table's stored key (mode 1), the
    record's key (mode 2); not encoded again with the serdes."""
    value_encoded: bool = False
    """As ``key_encoded``, for values."""
    topic: str | None = None
    """The topic the history is of (default: the app's only input)."""
    topic_col: str | None = None
    """The column naming each row's topic (mode 2: a history of all the app's inputs)."""
    partition_col: str | None = None
    offset_col: str | None = None
    """Each partition's resume position is its highest offset + 1; in mode 1 the row of
    a key with the highest offset wins (without it, a duplicate key is refused)."""
    reader_options: Mapping[str, str] | None = None
    """Options of Spark's reader for a history given as a source string."""

    # -- where the processors resume -------------------------------------------------------
    positions: Any = None
    """Resume positions: ``{(topic, part): next}`` or ``["topic:part=next", ...]``
    (:func:`~.positions.parse_positions`)."""
    from_start: bool = False
    """No positions: none of the history is in Kafka (the processors read it all)."""

    # -- the job and its cluster -----------------------------------------------------------
    p0: int | None = None
    """The job's initial processor count (placement of every key depends on it); default:
    the job's record in the cluster, else the app's, else the first input's partitions."""
    processors: int | None = None
    """The processor count the stores are built for (default ``p0``)."""
    broker: str | Connection | None = None
    """The cluster positions and processor counts are checked against (and the job
    recorded in); default: the app's."""
    state_dir: str | Path | None = None
    """Default: the app's ``state_dir``."""
    layout_epochs: Mapping[str, int] | None = None
    """Per topic, the epoch of its partition layout stamped into the checkpoints (over
    what the cluster says; for runs without a broker)."""
    topic_partitions: Mapping[str, int | tuple[int, int]] | None = None
    """Per topic, ``N`` or ``(N0, N)`` partitions: which processors own which partition
    when the history does not say (over what the cluster says)."""
    allow_partial: bool = False
    """Leave the app's other tables (mode 2: other inputs' state) empty."""
    allow_skipped: bool = False
    """Rows without a key (or that a handler rejects, or undecodable) are left out and
    counted in ``details["left_out"]`` instead of failing the run."""
    keep_backup: bool = False
    """Keep the replaced stores under ``.backfill/``."""

    # -- how the job runs ------------------------------------------------------------------
    spark: SparkSession | Callable[[], SparkSession] | None = None
    """A session, a factory of one (the CLI's: the JVM's output to a log file), or None
    for :func:`~.session.local_session`."""
    num_partitions: int | None = None
    """Spark tasks writing SST files (default: from the processors and Spark's parallelism)."""
    subs: int | None = None
    """Sub-buckets per processor: each writes its own SST file per table (default: enough
    for every core to have work)."""
    reporter: Reporter | None = None
    """Progress hooks (phases, the Spark job's tasks); default: log lines."""
    fail_at: str | None = None
    """Tests: the failure points to inject (:func:`~.staging.check_fail`)."""

    def over(self, changes: Mapping[str, Any], where: str) -> BackfillOptions:
        """These options with ``changes`` (a function's keyword arguments, each naming a
        field) over them; a name that is no field is refused as Python refuses it."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = [name for name in changes if name not in names]
        if unknown:
            raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}")
        return dataclasses.replace(self, **changes) if changes else self
