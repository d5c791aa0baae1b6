"""Rows without a key, dropped and counted by the tasks that place the rows.

A row without a key cannot be placed on a processor (Kafka spreads such records over the
partitions), so a backfill refuses a history that has any, with a count and samples,
unless it may leave them out (``allow_skipped``: then they are counted in its result).
The tasks of the backfill's own job count them as they read each row once: a count of
its own would run the caller's whole DataFrame (an aggregation, a join) a second time.

Each task adds what it saw to a Spark accumulator keyed by (input, partition), so a task
run again (a retried stage) replaces its count rather than adding to it. The refusal
comes after the job, before any store is built: the live stores are untouched.

Importable without pyspark (the accumulator's parameter is duck-typed, and the task
context is looked up only inside a task).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from streamkit.errors import ConfigError

__all__ = ["Keyless", "KeylessInput", "KeylessTally", "counted", "drop_keyless", "refuse_or_count"]

SAMPLES = 3
"""Rows without a key quoted in a refusal."""


@dataclass
class Keyless:
    """What one task saw of one input."""

    rows: int = 0
    keyless: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)


Seen = dict[tuple[int, int], Keyless]
"""(input, Spark partition) -> what its task saw: an accumulator's value."""


def drop_keyless(batches: Iterable[pa.RecordBatch], key_col: str, seen: Keyless) -> Iterator[pa.RecordBatch]:
    """``batches`` without their rows whose ``key_col`` is null, counted into ``seen``."""
    for batch in batches:
        seen.rows += batch.num_rows
        keys = batch.column(key_col)
        if keys.null_count:
            seen.keyless += keys.null_count
            if len(seen.samples) < SAMPLES:
                dropped = batch.filter(keys.is_null()).slice(0, SAMPLES - len(seen.samples))
                seen.samples.extend({c: v for c, v in row.items() if c != key_col} for row in dropped.to_pylist())
            batch = batch.filter(keys.is_valid())
        if batch.num_rows:
            yield batch


class KeylessTally:
    """The accumulator parameter: a dict of per-task counts, merged by key (idempotent)."""

    def zero(self, value: Seen) -> Seen:
        return {}

    def addInPlace(self, a: Seen, b: Seen) -> Seen:  # noqa: N802 - pyspark's AccumulatorParam method name
        a.update(b)
        return a


def _partition_id() -> int:
    try:
        from pyspark import TaskContext

        tc = TaskContext.get()
    except ImportError:  # pragma: no cover
        tc = None
    return tc.partitionId() if tc is not None else 0


def counted(fn: Callable[..., Iterator[Any]], tally: Any, tag: int, key_col: str, *args: Any) -> Iterator[Any]:
    """``fn(*args[:-1], batches)`` over ``args[-1]`` without its keyless rows; what was
    dropped goes to ``tally`` (an accumulator of :class:`KeylessTally`, or None) under
    (``tag``, this task's partition)."""
    seen = Keyless()
    yield from fn(*args[:-1], drop_keyless(args[-1], key_col, seen))
    if tally is not None:
        tally.add({(tag, _partition_id()): seen})


@dataclass(frozen=True)
class KeylessInput:
    """One input of a backfill as the caller named it: for a refusal."""

    what: str
    key_col: str
    columns: Mapping[str, str | None] = field(default_factory=dict)
    """The tasks' column -> the caller's (None: a struct of the caller's columns, shown
    as its fields; not listed: shown as is)."""

    def show(self, row: Mapping[str, Any]) -> str:
        out: dict[str, Any] = {}
        for col, value in row.items():
            name = self.columns.get(col, col)
            if name is None and isinstance(value, dict):
                out.update(value)
            else:
                out[name or col] = value
        return str(out)[:200]


def refuse_or_count(seen: Seen, inputs: Mapping[int, KeylessInput], allow: bool) -> tuple[int, int]:
    """(rows, rows without a key) over every input; a ``ConfigError`` naming the first
    input with keyless rows, with samples, unless ``allow``."""
    rows = keyless = 0
    for tag, source in sorted(inputs.items()):
        mine = [v for (t, _), v in sorted(seen.items()) if t == tag]
        n, missing = sum(v.rows for v in mine), sum(v.keyless for v in mine)
        rows, keyless = rows + n, keyless + missing
        if missing and not allow:
            samples = [source.show(s) for v in mine for s in v.samples][:SAMPLES]
            raise ConfigError(
                f"{source.what}: {missing:,} of {n:,} rows have no key (column {source.key_col!r} is null), e.g. "
                f"{'; '.join(samples)}; they cannot be placed on a processor. Fix the history, or pass "
                "allow_skipped=True to leave them out"
            )
    return rows, keyless
