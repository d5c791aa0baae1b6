"""Mode 2's stage B (``write_replay``, after ``repartition(bucket)`` +
``sortWithinPartitions``): each key's records arrive together, in the order of the
ordering columns; the app's own handlers run over them (``streamkit.replay.Replayer``,
the app loaded once per Python worker: ``load_spec_app``), and the resulting state is
written as one SST per (bucket, table) into the run's staging directory; one metadata
row per file (plus position and statistics rows) goes back to the driver.

Importable without pyspark (see :mod:`.tasks`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from streamkit.spark.task_output import Clocked, _cpu, _Offsets, _SstSink
from streamkit.spark.task_spec import Spec, TaskError, _meta


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
