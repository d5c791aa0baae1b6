"""Mode 1's stage B (``write_state``, after ``repartition(bucket)`` +
``sortWithinPartitions``): every bucket's rows arrive together, sorted by key; the row
with the highest offset of each key wins, and one SST per (bucket, table) is written
into the run's staging directory; one metadata row per file (plus position and
statistics rows) goes back to the driver. ``fused_state`` does stage A and B in one
task, for input already partitioned by key.

Importable without pyspark (see :mod:`.tasks`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from streamkit.spark.task_output import Clocked, _cpu, _Offsets, _SstSink
from streamkit.spark.task_place import place_state
from streamkit.spark.task_spec import Spec, TaskError, _meta


def _segments(
    spec: Spec, batches: Iterable[pa.RecordBatch], stats: dict[str, int], offsets: _Offsets
) -> Iterator[tuple[tuple[int, int], list[bytes], list[bytes]]]:
    """Deduplicated runs of rows sorted by (_b, _t, _k, _off): ``((bucket, table), keys, values)``.

    Vectorised per batch: of several rows of one key the last (highest offset) is kept;
    a kept null value means "no state" and is dropped. The last row of a batch is held
    back until the next batch shows whether the same key continues there.
    """
    import pyarrow.compute as pc

    have_offsets = spec.offset_col is not None
    pending: tuple[tuple[int, int], bytes, bytes | None] | None = None

    def refuse(table: int, key: bytes) -> TaskError:
        return TaskError(
            "duplicate",
            f"table {spec.tables[table].name!r}: key {key[:64]!r} appears more than once in the final-state "
            "DataFrame; give the offset column so the latest row wins, or deduplicate",
        )

    def flush(
        item: tuple[tuple[int, int], bytes, bytes | None],
    ) -> Iterator[tuple[tuple[int, int], list[bytes], list[bytes]]]:
        group, k, v = item
        if v is None:
            stats["nulls"] += 1
        else:
            yield group, [k], [v]

    for batch in batches:
        n = batch.num_rows
        if n == 0:
            continue
        stats["rows"] += n
        offsets.add(batch)
        b = batch.column("_b").to_numpy()
        t = batch.column("_t").to_numpy()
        k = batch.column("_k")
        v = batch.column("_v")
        # rows whose successor has the same (bucket, table, key) are superseded
        same_next = np.zeros(n, dtype=bool)
        if n > 1:
            same_next[:-1] = (
                (b[1:] == b[:-1])
                & (t[1:] == t[:-1])
                & pc.equal(k.slice(1), k.slice(0, n - 1)).to_numpy(zero_copy_only=False)
            )
        first_group = (int(b[0]), int(t[0]))
        kl = k.to_pylist()
        if pending is not None:
            if pending[0] == first_group and pending[1] == kl[0]:
                if not have_offsets:
                    raise refuse(first_group[1], kl[0])
                stats["dups"] += 1
            else:
                yield from flush(pending)
            pending = None
        dups = int(same_next.sum())
        if dups:
            if not have_offsets:
                i = int(np.flatnonzero(same_next)[0])
                raise refuse(int(t[i]), kl[i])
            stats["dups"] += dups
        keep = ~same_next
        keep[-1] = False  # held back
        pending = ((int(b[-1]), int(t[-1])), kl[-1], v[n - 1].as_py())
        valid = v.is_valid().to_numpy(zero_copy_only=False)
        stats["nulls"] += int((keep & ~valid).sum())
        keep &= valid
        vl = v.to_pylist()
        # split the kept rows into runs of one (bucket, table)
        starts = np.flatnonzero(np.r_[True, (b[1:] != b[:-1]) | (t[1:] != t[:-1])])
        ends = np.r_[starts[1:], n]
        for s0, e0 in zip(starts.tolist(), ends.tolist()):
            idx = np.flatnonzero(keep[s0:e0])
            if idx.size == 0:
                continue
            if idx.size == e0 - s0:
                yield (int(b[s0]), int(t[s0])), kl[s0:e0], vl[s0:e0]
            else:
                idx += s0
                yield (int(b[s0]), int(t[s0])), [kl[i] for i in idx], [vl[i] for i in idx]
    if pending is not None:
        yield from flush(pending)


def write_state(spec: Spec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Mode 1, stage B: rows sorted by (_b, _t, _k, _off) -> one SST per (bucket, table).

    Several rows of one key: the one with the highest offset wins when offsets are
    given, otherwise the backfill is refused (the final state would be ambiguous). A
    key whose winning value is null has no state.
    """
    t0 = _cpu()
    batches = Clocked(batches)
    sink = _SstSink(spec)
    offsets = _Offsets(spec.subs)
    stats = {"rows": 0, "dups": 0, "nulls": 0}
    out: list[dict[str, Any]] = []
    for (b, t), runs in itertools.groupby(_segments(spec, batches, stats, offsets), key=lambda r: r[0]):
        codec = spec.tables[t]
        w0 = _cpu()
        items = (kv for _, ks, vs in runs for kv in zip(ks, vs))
        path, n = sink.write(b, codec.name, items)
        if path is not None:
            out.append(
                {
                    "kind": "sst",
                    "bucket": b,
                    "proc": b // spec.subs,
                    "table": codec.name,
                    "path": path,
                    "keys": n,
                    "seconds": _cpu() - w0,
                }
            )
    out.extend(offsets.rows())
    info = f"dups={stats['dups']} nulls={stats['nulls']}"
    out.append({"kind": "stats", "rows": stats["rows"], "info": info, "seconds": _cpu() - t0})
    out.append({"kind": "timing", "info": "input_wait", "seconds": batches.wait})
    yield _meta(out)


def fused_state(spec: Spec, table_index: int, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Mode 1 without a shuffle, for input whose rows of a key all sit in one partition
    (e.g. the output of ``groupBy(key)``): stage A, then this partition's rows sorted in
    Arrow by (bucket, key, offset), then stage B; one SST per (bucket, partition)."""
    import pyarrow.compute as pc

    t0 = _cpu()
    placed = [b for b in place_state(spec, table_index, batches) if b.num_rows]
    a_cpu = _cpu() - t0
    if not placed:
        yield from write_state(spec, iter(()))
        return
    table = pa.Table.from_batches(placed)
    order = pc.sort_indices(table, [("_b", "ascending"), ("_k", "ascending"), ("_off", "ascending")])
    table = table.take(order)
    metas = list(write_state(spec, iter(table.to_batches(max_chunksize=65536))))
    yield from metas
    yield _meta([{"kind": "timing", "info": "stage_a", "seconds": a_cpu}])
