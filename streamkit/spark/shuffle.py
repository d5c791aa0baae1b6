"""Spreading buckets over Spark partitions: the ``_sp`` shuffle keys and the stage A
wrapper that adds them (and times the stage)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from streamkit.spark.keyless import counted

if TYPE_CHECKING:
    from streamkit.spark import tasks

__all__ = ["TaskCounters", "spark_partition_keys"]


def _murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of an IntegerType value (Murmur3_x86_32.hashInt), signed."""
    m = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & m

    k1 = (value & m) * 0xCC9E2D51 & m
    k1 = rotl(k1, 15) * 0x1B873593 & m
    h1 = seed ^ k1
    h1 = (rotl(h1, 13) * 5 + 0xE6546B64) & m
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & m
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & m
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def spark_partition_keys(n: int) -> list[int]:
    """For each Spark partition ``i < n``, an int whose hash partitioning lands in ``i``.

    ``repartition(n, col)`` places a row in ``pmod(hash(col), n)``; shuffling on these
    keys (``_sp``) instead of the bucket ids spreads buckets exactly round-robin, where
    Spark's own hash of small ints would leave some tasks empty and others doubled.
    """
    keys: dict[int, int] = {}
    x = 0
    while len(keys) < n:
        keys.setdefault(_murmur3_int(x) % n, x)
        x += 1
    return [keys[i] for i in range(n)]


class TaskCounters(NamedTuple):
    """What stage A tasks report to the driver (Spark accumulators)."""

    cpu: Any
    """CPU seconds of stage A (a float accumulator)."""
    keyless: Any
    """Rows read and rows without a key, per input and task (``keyless.KeylessTally``)."""


def _timed(
    fn: Callable[..., Iterator[Any]], counters: TaskCounters | None, tag: int, spec: tasks.Spec, *args: Any
) -> Iterator[Any]:
    """Run a stage A generator over its input's keyed rows (those without a key dropped
    and counted: :func:`.keyless.counted`, under ``tag``), adding the ``_sp`` column, and
    its CPU time (the Python worker's, so neither waits for the JVM nor CPU contention
    count) to ``counters``."""
    import numpy as np
    import pyarrow as pa

    sp_keys = spec.extra["sp_keys"]
    n = len(sp_keys)
    lookup = np.asarray(sp_keys, dtype=np.int32)
    spent = 0.0
    gen = counted(fn, counters.keyless if counters else None, tag, spec.key_col, spec, *args)
    while True:
        t0 = time.process_time()
        try:
            batch = next(gen)
        except StopIteration:
            break
        b = batch.column(0).to_numpy()
        sp = pa.array(lookup[b % n], pa.int32())
        out = pa.RecordBatch.from_arrays([sp, *batch.columns], names=["_sp", *batch.schema.names])
        spent += time.process_time() - t0
        yield out
    if counters is not None:
        counters.cpu.add(spent)
