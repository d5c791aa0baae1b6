"""What every stage B task (:mod:`.task_write_state`, :mod:`.task_write_replay`) hands
back besides its data: the SST files it writes into the run's staging directory
(attempt-unique names, renamed on success), the highest offset it saw per (processor,
topic, partition), and its timings (CPU seconds, and the time spent waiting for input).

Importable without pyspark (see :mod:`.tasks`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from stores.rocksdb import store_options, write_sst
from streamkit.spark.staging import check_fail
from streamkit.spark.task_spec import Spec, TaskError

_cpu = time.process_time  # task timings are CPU seconds of the Python worker (contention-proof)


def _task_ids() -> tuple[int, int]:
    """(partition id, attempt id) of the running task; (0, pid) outside Spark."""
    try:
        from pyspark import TaskContext

        tc = TaskContext.get()
    except ImportError:  # pragma: no cover
        tc = None
    if tc is None:
        return 0, os.getpid()
    return tc.partitionId(), tc.taskAttemptId()


def _attempt_number() -> int:
    try:
        from pyspark import TaskContext

        tc = TaskContext.get()
    except ImportError:  # pragma: no cover
        return 0
    return tc.attemptNumber() if tc is not None else 0


class Clocked:
    """An iterator wrapper that adds up the time spent waiting for the next item
    (in a Spark task: the JVM producing the input), so Python's own time can be told apart."""

    def __init__(self, it: Iterable[Any]) -> None:
        self.it = iter(it)
        self.wait = 0.0

    def __iter__(self) -> Clocked:
        return self

    def __next__(self) -> Any:
        t = time.perf_counter()
        try:
            return next(self.it)
        finally:
            self.wait += time.perf_counter() - t


class _SstSink:
    """Writes one SST per (bucket, table) under an attempt-unique name, renamed on success."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.opts = store_options()
        self.partition, self.attempt = _task_ids()

    def write(self, bucket: int, table: str, items: Iterable[tuple[bytes, bytes]]) -> tuple[str | None, int]:
        proc, sub = divmod(bucket, self.spec.subs)
        directory = os.path.join(self.spec.sst_root, f"processor-{proc}", table)
        # deterministic names: by bucket (after the shuffle a bucket is in one task), plus
        # the input partition when tasks write without a shuffle (fused)
        name = f"sub-{sub}-part-{self.partition}.sst" if self.spec.extra.get("fused") else f"sub-{sub}.sst"
        final = os.path.join(directory, name)
        tmp = f"{final}.tmp-{self.attempt}"
        try:
            check_fail("task", self.spec.fail_at)
        except Exception as exc:  # noqa: BLE001 - InjectedFailure, shown as such by the driver
            raise TaskError("injected", str(exc)) from None
        try:
            if self.spec.fail_at and "task-once" in self.spec.fail_at and _attempt_number() == 0:
                # Leave a half-written temporary behind, as a killed attempt would.
                def failing() -> Iterator[tuple[bytes, bytes]]:
                    for i, item in enumerate(items):
                        yield item
                        if i == 10:
                            break
                    raise TaskError("injected", "injected failure in the first task attempt")

                written = write_sst(tmp, failing(), self.opts)
            else:
                written = write_sst(tmp, items, self.opts)
        except BaseException:
            if not (self.spec.fail_at and "task-once" in self.spec.fail_at):
                try:
                    os.remove(tmp)
                except OSError:
                    pass
            raise
        if written == 0:
            return None, 0
        os.rename(tmp, final)  # the directory exists (driver-made): no mkdir, ever
        return final, written


class _Offsets:
    """Per (processor, topic, partition): the highest offset seen (vectorised per batch).

    The driver derives the resume positions from these (highest + 1) and stamps each
    position only into the stores of processors that own keys of that partition.
    """

    def __init__(self, subs: int) -> None:
        self.subs = subs
        self.max: dict[tuple[int, str, int], int] = {}

    def add(self, batch: pa.RecordBatch) -> None:
        off = batch.column("_off")
        if off.null_count == len(off):
            return
        procs = pa.array(batch.column("_b").to_numpy() // self.subs, pa.int32())
        t = pa.table(
            [procs, batch.column("_topic"), batch.column("_part"), off], names=["_p", "_topic", "_part", "_off"]
        )
        t = t.filter(t.column("_off").is_valid())
        if t.column("_topic").null_count or t.column("_part").null_count:
            raise TaskError("offsets", "rows with an offset must also have a topic and a partition")
        g = t.group_by(["_p", "_topic", "_part"]).aggregate([("_off", "max")])
        for key in zip(
            g.column("_p").to_pylist(),
            g.column("_topic").to_pylist(),
            g.column("_part").to_pylist(),
            g.column("_off_max").to_pylist(),
        ):
            k, mx = key[:3], key[3]
            if mx > self.max.get(k, -1):
                self.max[k] = mx

    def rows(self) -> list[dict[str, Any]]:
        return [
            {"kind": "offset", "proc": p, "topic": t, "part": q, "max_off": o}
            for (p, t, q), o in sorted(self.max.items())
        ]
