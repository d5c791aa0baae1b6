"""Stage B of the Spark tasks (``write_*``, after ``repartition(bucket)`` +
``sortWithinPartitions``): every bucket's rows arrive together, sorted by key; write one
SST per (bucket, table) into the run's staging directory, and return one metadata row per
file (plus position and statistics rows) to the driver. Mode 2's stage B runs the app's
own handlers over each key's records (``streamkit.replay.Replayer``), in the order of the
ordering columns, and writes the resulting state.

Importable without pyspark (see :mod:`.tasks`).
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from stores.rocksdb import store_options, write_sst
from streamkit.spark.staging import check_fail
from streamkit.spark.task_place import place_state
from streamkit.spark.task_spec import Spec, TaskError, _meta

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


def _ensure_sys_path(paths: Iterable[str]) -> None:
    for p in reversed(list(paths)):
        if p and p not in sys.path and os.path.isdir(p):
            sys.path.insert(0, p)


_APPS: dict[Any, Any] = {}


def load_spec_app(spec: Spec) -> Any:
    """The app, loaded once per Python worker (by ``MODULE:ATTR`` or from a pickle)."""
    key = spec.app_ref or spec.app_pickle
    app = _APPS.get(key)
    if app is None:
        _ensure_sys_path(spec.sys_path)
        if spec.app_ref is not None:
            from streamkit.loader import load_app

            app = load_app(spec.app_ref)
        else:
            import pickle  # written by pyspark's cloudpickle; plain pickle reads it

            assert spec.app_pickle is not None  # a spec names the app or carries it pickled
            app = pickle.loads(spec.app_pickle)
        _APPS[key] = app
    return app


# --------------------------------------------------------------------------- stage B


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


def _first(item: tuple[bytes, bytes]) -> bytes:
    return item[0]


def write_replay(spec: Spec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Mode 2, stage B: records sorted by (key hash, key, order...) -> run the handlers
    per key, emitting nothing, and write the resulting state as one SST per (bucket, table).

    Sorting on a 64-bit hash of the key first makes Spark's sort compare longs (its
    prefix sort) instead of key bytes; each key's records are still contiguous and in
    order, and the state is put in key order here before the SST files are written."""
    from streamkit.errors import ReplayError
    from streamkit.replay import Replayer
    from streamkit.spark.global_load import HeldGlobal

    t0 = _cpu()
    batches = Clocked(batches)
    app = load_spec_app(spec)
    assert spec.topic is not None
    topics: list[str] = spec.extra.get("topics") or [spec.topic]
    replayer = Replayer(app, topics)
    for name, data in (spec.extra.get("globals") or {}).items():  # read before the replay, by the driver
        app.global_tables[name].bind(HeldGlobal(app.global_tables[name], data))
    sink = _SstSink(spec)
    offsets = _Offsets(spec.subs)
    stats = {"rows": 0, "keys": 0}
    wanted = {c.name for c in spec.tables}
    stream_times: dict[int, int] = spec.extra.get("stream_times") or {}
    streamed = "stream_times" in spec.extra  # windowed tables: each record with its stream time (_st)
    merged = len(topics) > 1  # each record names its topic

    def runs() -> Iterator[tuple[bytes, int, Iterable[tuple[Any, ...]]]]:
        """(key, bucket, records) per key: runs found vectorised per batch; a run that
        reaches the end of a batch is carried into the next one."""
        import pyarrow.compute as pc

        carry: tuple[Any, ...] | None = None
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            stats["rows"] += n
            offsets.add(batch)
            k = batch.column("_k")
            kl = k.to_pylist()
            vl = batch.column("_v").to_pylist()
            tl = batch.column("_ts").to_pylist()
            part, off = batch.column("_part"), batch.column("_off")
            pl = [-1] * n if part.null_count == n else part.fill_null(-1).to_pylist()
            ol = [-1] * n if off.null_count == n else off.fill_null(-1).to_pylist()
            cols: tuple[list[Any], ...] = (vl, tl, pl, ol)
            if streamed or merged:
                cols += (batch.column("_st").to_pylist() if streamed else [-1] * n,)
            if merged:
                cols += (batch.column("_topic").to_pylist(),)
            bl = batch.column("_b").to_numpy()
            change = np.ones(n, dtype=bool)
            if n > 1:
                change[1:] = pc.invert(pc.equal(k.slice(1), k.slice(0, n - 1))).to_numpy(zero_copy_only=False)
            starts = np.flatnonzero(change).tolist()
            ends = starts[1:] + [n]
            for s0, e0 in zip(starts, ends):
                if carry is not None:
                    if s0 == 0 and carry[0] == kl[0]:
                        for acc, src in zip(carry[2:], cols):
                            acc.extend(src[0:e0])
                        if e0 == n:
                            continue
                        yield carry[0], carry[1], zip(*carry[2:])
                        carry = None
                        continue
                    yield carry[0], carry[1], zip(*carry[2:])
                    carry = None
                if e0 == n:
                    carry = (kl[s0], int(bl[s0]), *(c[s0:e0] for c in cols))
                else:
                    yield kl[s0], int(bl[s0]), zip(*(c[s0:e0] for c in cols))
        if carry is not None:
            yield carry[0], carry[1], zip(*carry[2:])

    out: list[dict[str, Any]] = []
    states: dict[int, dict[str, list[tuple[bytes, bytes]]]] = {}
    r0 = _cpu()
    try:
        # Records arrive grouped by key (sorted by key hash, key, order): one handler run per key.
        for k, b, records in runs():
            stats["keys"] += 1
            result = replayer.run_key(k, records, close_through=stream_times.get(b // spec.subs, -1))
            state = states.get(b)
            if state is None:
                state = states[b] = {name: [] for name in wanted}
            for name, kv in result.items():
                if name in state and kv:
                    # compact copies: a serde's bytes (orjson's) may pin ~4 KiB each
                    state[name].extend((sk, bytes(memoryview(v))) for sk, v in kv.items())
        replay_s = _cpu() - r0
        for b in sorted(states):
            for name in sorted(states[b]):
                items = states[b][name]
                if not items:
                    continue
                items.sort(key=_first)  # store key order (keys arrived in hash order)
                w0 = _cpu()
                path, n = sink.write(b, name, items)
                if path is not None:
                    out.append(
                        {
                            "kind": "sst",
                            "bucket": b,
                            "proc": b // spec.subs,
                            "table": name,
                            "path": path,
                            "keys": n,
                            "seconds": _cpu() - w0,
                        }
                    )
    except ReplayError as exc:
        raise TaskError("replay", str(exc)) from None
    finally:
        replayer.close()
        for table in app.global_tables.values():
            table.bind(None)
    out.extend(offsets.rows())
    st = replayer.stats
    info = f"keys={stats['keys']} skipped_decode={st.skipped_decode} handler_errors={st.handler_errors} late={st.late}"
    for err in st.errors[:5]:
        info += f"\n{err}"
    out.append({"kind": "stats", "rows": stats["rows"], "keys": stats["keys"], "info": info, "seconds": _cpu() - t0})
    out.append({"kind": "timing", "info": "replay", "seconds": replay_s})
    out.append({"kind": "timing", "info": "input_wait", "seconds": batches.wait})
    yield _meta(out)
