"""The single-process baselines of the backfill benchmark: the same stores built
without Spark (pyarrow aggregation or per-key replay, then SST files)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.backfill_input import TOPIC


def baseline(parquet: Path, state_dir: Path, app: Any, p: int, mode: str) -> dict[str, float]:
    """Single process: pyarrow aggregation, vectorised placement, RocksDB (WriteBatch or SST)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stores.base import Checkpoint
    from stores.rocksdb import RocksDBStore, write_sst
    from stores.serde import JsonSerde
    from streamkit.spark.encoding import encode_array
    from streamkit.spark.placement import processors_of

    t = {}
    t0 = time.perf_counter()
    table = pq.read_table(parquet)
    t["read"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    agg = table.group_by("key").aggregate([("amount", "count"), ("amount", "sum")])
    last = table.group_by("partition").aggregate([("offset", "max")])
    positions = {
        (TOPIC, int(q)): int(o) + 1 for q, o in zip(last["partition"].to_pylist(), last["offset_max"].to_pylist())
    }
    t["aggregate"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    keys = agg["key"].combine_chunks().cast(pa.large_binary())
    proc = processors_of(keys, p, p)
    # the same vectorised JSON encoding the bridge uses (equal to orjson.dumps, tested)
    struct = pa.StructArray.from_arrays(
        [agg["amount_count"].combine_chunks(), agg["amount_sum"].combine_chunks()], names=["count", "sum"]
    )
    values = encode_array(JsonSerde(), struct, what="value").to_pylist()
    t["encode+place"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    app_dir = state_dir / app.name
    shutil.rmtree(app_dir, ignore_errors=True)
    key_list = keys.to_pylist()
    owners = _owners(table, p)  # checkpoints hold the positions of partitions a processor has keys of
    for q in range(p):
        idx = np.flatnonzero(proc == q)
        ks = [key_list[i] for i in idx]
        vs = [values[i] for i in idx]
        cp = Checkpoint(positions={tp: o for tp, o in positions.items() if q in owners.get(tp[1], ())})
        path = app_dir / f"processor-{q}"
        if mode == "writebatch":
            store = RocksDBStore.open(str(path), sorted(app.tables))
            step = 100_000
            for i in range(0, len(ks), step):
                store.commit({"totals": dict(zip(ks[i : i + step], vs[i : i + step]))}, cp)
            if not ks:
                store.commit({}, cp)
            store.close()
        else:
            order = sorted(range(len(ks)), key=ks.__getitem__)
            sst = state_dir / f"baseline-{q}.sst"
            write_sst(sst, ((ks[i], vs[i]) for i in order))
            RocksDBStore.create_from_sst(str(path), sorted(app.tables), {"totals": [str(sst)]}, cp, move=True).close()
    t["write stores"] = time.perf_counter() - t3
    t["total"] = time.perf_counter() - t0
    return t


def _owners(table: Any, p: int) -> dict[int, set[int]]:
    """partition -> processors owning keys of it (for the baseline's checkpoints)."""
    import pyarrow as pa

    from streamkit.spark.placement import processors_of

    keys = table["key"].combine_chunks()
    procs = processors_of(keys, p, p)
    pairs = pa.table({"part": table["partition"], "proc": pa.array(procs)}).group_by(["part", "proc"]).aggregate([])
    out: dict[int, set[int]] = {}
    for q, pr in zip(pairs["part"].to_pylist(), pairs["proc"].to_pylist()):
        out.setdefault(q, set()).add(pr)
    return out


def baseline_replay(parquet: Path, state_dir: Path, app: Any, p: int) -> dict[str, float]:
    """Single process: sort the events by (key, offset), replay the handler per key, write SSTs."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from stores.base import Checkpoint
    from stores.rocksdb import RocksDBStore, write_sst
    from streamkit.replay import Replayer
    from streamkit.spark.placement import processors_of

    t = {}
    t0 = time.perf_counter()
    table = pq.read_table(parquet)
    t["read"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    keys = table["key"].combine_chunks().cast(pa.large_binary())
    table = table.append_column("_p", pa.array(processors_of(keys, p, p)))
    table = table.append_column("_k", keys)
    table = table.take(pc.sort_indices(table, [("_p", "ascending"), ("_k", "ascending"), ("offset", "ascending")]))
    t["sort"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    rep = Replayer(app, TOPIC)
    procs = table["_p"].to_numpy()
    kl = table["_k"].to_pylist()
    vl = [b'{"amount":%d}' % a for a in table["amount"].to_pylist()]  # = orjson.dumps, compact
    parts = table["partition"].to_pylist()
    offs = table["offset"].to_pylist()
    out: dict[int, list[tuple[bytes, bytes]]] = {q: [] for q in range(p)}
    i = 0
    n = len(kl)
    while i < n:
        j = i + 1
        while j < n and kl[j] == kl[i]:
            j += 1
        res = rep.run_key(kl[i], ((vl[x], -1, parts[x], offs[x]) for x in range(i, j)))
        out[int(procs[i])].extend((k, bytes(memoryview(v))) for k, v in res["totals"].items())
        i = j
    t["replay"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    last = table.group_by("partition").aggregate([("offset", "max")])
    positions = {
        (TOPIC, int(q)): int(o) + 1 for q, o in zip(last["partition"].to_pylist(), last["offset_max"].to_pylist())
    }
    owners = _owners(table, p)
    app_dir = state_dir / app.name
    shutil.rmtree(app_dir, ignore_errors=True)
    for q in range(p):
        sst = state_dir / f"baseline-replay-{q}.sst"
        write_sst(sst, out[q])
        cp = Checkpoint(positions={tp: o for tp, o in positions.items() if q in owners.get(tp[1], ())})
        RocksDBStore.create_from_sst(
            str(app_dir / f"processor-{q}"), sorted(app.tables), {"totals": [str(sst)]}, cp, move=True
        ).close()
    t["write stores"] = time.perf_counter() - t3
    t["total"] = time.perf_counter() - t0
    return t
