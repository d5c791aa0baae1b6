"""Benchmark: the Spark bridge's backfill vs a single-process pyarrow + RocksDB baseline.

    python -m benchmarks.backfill                       # 5,000,000 events -> 1,000,000 keys
    python -m benchmarks.backfill --events 500000 --keys 100000 --replay

The input is a Parquet file of events ``(key, amount, partition, offset)`` (generated once
per size, cached in the work directory); the table is count + sum per key, as the
stateful peers compute it. Every contender writes the same ``p`` processor stores
(placement by murmur2 + linear hashing, JSON values, checkpoint positions) and the run
checks that they are byte-for-byte equal.

Contenders, in the same run:

- ``baseline-writebatch``: one Python process: pyarrow reads and aggregates, keys are
  placed with the vectorised hash, values encoded with orjson, each store written with
  ``RocksDBStore.commit`` (a WriteBatch per 100,000 keys).
- ``baseline-sst``: the same, but each store built from one sorted SST file (ingest).
- ``spark-state``: Spark reads and aggregates (``groupBy``), then ``backfill_table``
  (mode 1). Reported with and without the JVM start.
- ``spark-state-fused``: the same with ``partitioned_by_key=True`` (the aggregate is
  partitioned by key already, so the bridge skips its own shuffle and sort).
- ``spark-replay`` (``--replay``): ``backfill_replay`` runs the app's handler over the 5M
  events (mode 2), next to ``baseline-replay``: the same handler replayed in one process.

The breakdown shows where the Spark time goes: JVM start, the aggregation alone (a
``noop`` write of the aggregated DataFrame), and the backfill job split into its Python
stages (CPU seconds summed over tasks: stage A encode+place, stage B sort-merge + SST
writing), the JVM's part (wall minus Python), building stores (ingest) and publishing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PARTITIONS = 8
TOPIC = "events"


# --------------------------------------------------------------------------- the app


def _make_app(name: str, state_dir: str, processors: int) -> Any:
    import streamkit

    app = streamkit.App(name, processors=processors, state_dir=state_dir)
    events = app.topic(TOPIC)
    totals = app.table("totals")

    @app.processor(events)
    def count(key: str, value: dict[str, Any], ctx: Any) -> None:
        row = totals.get(key)
        if row is None:
            totals[key] = {"count": 1, "sum": value["amount"]}
        else:
            totals[key] = {"count": row["count"] + 1, "sum": row["sum"] + value["amount"]}

    return app


# --------------------------------------------------------------------------- input


def make_input(path: Path, events: int, keys: int, seed: int = 7) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from assignors.vectorized import key_hash_arrow

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, keys, events)
    ids[:keys] = rng.permutation(keys)[: min(keys, events)]  # every key appears at least once
    rng.shuffle(ids)
    key_arr = pa.array(np.char.add("user-", ids.astype(str)).astype(object), pa.string())
    part = (key_hash_arrow(key_arr) % PARTITIONS).astype(np.int32)
    # Kafka offsets: position of each event within its partition
    offset = np.empty(events, dtype=np.int64)
    for p in range(PARTITIONS):
        idx = np.flatnonzero(part == p)
        offset[idx] = np.arange(idx.size)
    table = pa.table(
        {
            "key": key_arr,
            "amount": rng.integers(1, 100, events),
            "partition": part,
            "offset": offset,
        }
    )
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp, row_group_size=1 << 20)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- baselines


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


# --------------------------------------------------------------------------- spark


def _aggregated(spark: Any, parquet: Path) -> Any:
    """The final-state DataFrame: count + sum per key, with the last offset and the partition."""
    import pyspark.sql.functions as F

    ev = spark.read.parquet(str(parquet))
    return ev.groupBy("key").agg(
        F.struct(F.count("*").alias("count"), F.sum("amount").alias("sum")).alias("value"),
        F.max("offset").alias("offset"),
        F.first("partition").alias("partition"),
    )


def spark_state(spark: Any, parquet: Path, app: Any, state_dir: Path, fused: bool = False) -> tuple[float, Any]:
    """Read + aggregate in Spark, then backfill_table (mode 1): the bridge's wall time.
    ``fused``: tell the bridge the DataFrame is partitioned by key (it is: groupBy output)."""
    from streamkit.spark import backfill_table

    t0 = time.perf_counter()
    res = backfill_table(
        app,
        "totals",
        _aggregated(spark, parquet),
        offset_col="offset",
        partition_col="partition",
        state_dir=state_dir,
        spark=spark,
        partitioned_by_key=fused,
    )
    return time.perf_counter() - t0, res


def spark_breakdown(spark: Any, parquet: Path, p: int, work: Path, repeat: int = 2) -> list[tuple[str, float]]:
    """The mode 1 job built up one step at a time (each step a full run, wall seconds):
    what each part of the pipeline adds on top of Spark's own read + aggregation."""
    import functools

    from stores.serde import JsonSerde, StrSerde
    from streamkit.spark import tasks
    from streamkit.spark.shuffle import _timed, spark_partition_keys
    from streamkit.spark.state_mode import _STATE_A_DDL

    sst = work / "breakdown-sst"
    shutil.rmtree(sst, ignore_errors=True)
    for q in range(p):
        (sst / f"processor-{q}" / "totals").mkdir(parents=True)
    spec = tasks.Spec(
        mode="state",
        p0=p,
        p=p,
        subs=1,
        sst_root=str(sst),
        key_col="key",
        value_col="value",
        topic=TOPIC,
        partition_col="partition",
        offset_col="offset",
        tables=(tasks.TableCodec("totals", StrSerde(), JsonSerde()),),
        extra={"sp_keys": spark_partition_keys(p)},
    )

    def a(df: Any) -> Any:
        return df.mapInArrow(functools.partial(_timed, tasks.place_state, None, spec, 0), _STATE_A_DDL)

    def b(df: Any) -> Any:
        return df.drop("_sp").mapInArrow(functools.partial(tasks.write_state, spec), tasks.META_DDL)

    sort_cols = ("_b", "_t", "_k", "_off")
    steps = [
        ("Parquet scan alone", lambda: spark.read.parquet(str(parquet)), False),
        ("+ aggregate (groupBy key): the input DataFrame", lambda: _aggregated(spark, parquet), False),
        ("+ stage A in Python (encode, hash, place)", lambda: a(_aggregated(spark, parquet)), False),
        ("+ shuffle by bucket", lambda: a(_aggregated(spark, parquet)).repartition(p, "_sp"), False),
        (
            "+ sort within partitions",
            lambda: a(_aggregated(spark, parquet)).repartition(p, "_sp").sortWithinPartitions(*sort_cols),
            False,
        ),
        (
            "+ stage B in Python (SST files): the whole job",
            lambda: b(a(_aggregated(spark, parquet)).repartition(p, "_sp").sortWithinPartitions(*sort_cols)),
            True,
        ),
    ]
    out = []
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "65536")
    for name, build, collect in steps:
        best = float("inf")
        for _ in range(repeat):  # the best of a few: the machine is shared
            t0 = time.perf_counter()
            df = build()
            if collect:
                df.collect()
            else:
                df.write.format("noop").mode("overwrite").save()
            best = min(best, time.perf_counter() - t0)
        out.append((name, best))
    shutil.rmtree(sst, ignore_errors=True)
    return out


def spark_replay(spark: Any, parquet: Path, app: Any, state_dir: Path) -> tuple[dict[str, float], Any]:
    from streamkit.spark import backfill_replay

    t0 = time.perf_counter()
    ev = spark.read.parquet(str(parquet))
    res = backfill_replay(
        app, ev, value_col=["amount"], partition_col="partition", offset_col="offset", state_dir=state_dir, spark=spark
    )
    return {"total": time.perf_counter() - t0}, res


# --------------------------------------------------------------------------- checks


def stores_equal(a: Path, b: Path, p: int) -> tuple[bool, int]:
    from stores.rocksdb import RocksDBStore

    keys = 0
    for q in range(p):
        sa = RocksDBStore.open(str(a / f"processor-{q}"), ["totals"], create=False)
        sb = RocksDBStore.open(str(b / f"processor-{q}"), ["totals"], create=False)
        try:
            ia, ib = list(sa.items("totals")), list(sb.items("totals"))
            if ia != ib or sa.checkpoint().positions != sb.checkpoint().positions:
                return False, keys
            keys += len(ia)
        finally:
            sa.close()
            sb.close()
    return True, keys


# --------------------------------------------------------------------------- main


def _fmt(t: float) -> str:
    return f"{t:7.2f}s"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--processors", type=int, default=4)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2, help="runs per contender (the best is compared)")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "streamkit-bench-backfill")
    ap.add_argument("--replay", action="store_true", help="also run mode 2 (the handler over every event)")
    ap.add_argument("--no-breakdown", action="store_true", help="skip the step-by-step breakdown runs")
    args = ap.parse_args(argv)

    work: Path = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    parquet = work / f"events-{args.events}-{args.keys}.parquet"
    if not parquet.exists():
        print(f"generating {parquet} ...", flush=True)
        make_input(parquet, args.events, args.keys)
    p = args.processors
    print(
        f"input: {args.events:,} events, {args.keys:,} keys, {PARTITIONS} partitions; {p} processors; "
        f"local Spark with {args.cores} cores; os.cpu_count()={os.cpu_count()}",
        flush=True,
    )
    runs: dict[str, list[float]] = {}
    parts: dict[str, dict[str, float]] = {}
    dirs: dict[str, Path] = {}

    def fresh(name: str) -> tuple[Path, Any]:
        d = work / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        dirs[name] = d / "bench"
        return d, _make_app("bench", str(d), p)

    for rnd in range(args.runs):
        for mode in ("writebatch", "sst"):
            name = f"baseline-{mode}"
            d, app = fresh(name)
            t = baseline(parquet, d, app, p, mode)
            runs.setdefault(name, []).append(t["total"])
            if t["total"] <= min(runs[name]):
                parts[name] = t
            print(f"{name} run {rnd + 1}: {t['total']:.2f}s", flush=True)

    t0 = time.perf_counter()
    from streamkit.spark.session import local_session

    spark = local_session(args.cores, shuffle_partitions=args.cores * 2)
    jvm = time.perf_counter() - t0
    # Warm-up, untimed in the comparison: the first queries after a JVM start pay for
    # Python worker start-up, class loading, code generation and JIT. A small backfill
    # of the same shape (both variants) pays them; reported next to the JVM start.
    tw = time.perf_counter()
    small = work / "warmup-20000-5000.parquet"
    if not small.exists():
        make_input(small, 20_000, 5_000)
    for fused in (False, True):
        d, app = fresh("warmup")
        spark_state(spark, small, app, d, fused)
    dirs.pop("warmup")
    warm = time.perf_counter() - tw
    print(f"JVM start: {jvm:.2f}s, warm-up: {warm:.2f}s", flush=True)
    results: dict[str, Any] = {}
    for rnd in range(args.runs):
        for name, fused in (("spark-state", False), ("spark-state-fused", True)):
            d, app = fresh(name)
            secs, r = spark_state(spark, parquet, app, d, fused)
            runs.setdefault(name, []).append(secs)
            results[name] = r
            print(f"{name} run {rnd + 1}: {secs:.2f}s", flush=True)
    res = results["spark-state"]
    breakdown = [] if args.no_breakdown else spark_breakdown(spark, parquet, p, work)

    replay_res = None
    if args.replay:
        d, rapp = fresh("baseline-replay")
        t = baseline_replay(parquet, d, rapp, p)
        runs["baseline-replay"] = [t["total"]]
        parts["baseline-replay"] = t
        print(f"baseline-replay: {t['total']:.2f}s", flush=True)
        d, rapp = fresh("spark-replay")
        st, replay_res = spark_replay(spark, parquet, rapp, d)
        runs["spark-replay"] = [st["total"]]
        print(f"spark-replay: {st['total']:.2f}s", flush=True)

    # -- correctness: every contender wrote the same stores ----------------------------------
    ref = dirs["baseline-writebatch"]
    checks = {name: stores_equal(ref, path, p) for name, path in dirs.items() if name != "baseline-writebatch"}

    # -- report -------------------------------------------------------------------------------
    best = {name: min(v) for name, v in runs.items()}
    base_name = min(("baseline-writebatch", "baseline-sst"), key=best.__getitem__)
    base = best[base_name]
    bridge = best["spark-state"]
    fused_best = best["spark-state-fused"]
    print()
    print("=" * 86)
    print(f"{args.events:,} events -> {args.keys:,}-key table, {p} stores; best of {args.runs} run(s), all runs listed")
    print("-" * 86)
    for name in ("baseline-writebatch", "baseline-sst", "spark-state", "spark-state-fused"):
        all_runs = ", ".join(f"{x:.2f}" for x in runs[name])
        print(f"{name:<22} {_fmt(best[name])}   {args.events / best[name] / 1e6:5.2f}M events/s   runs: {all_runs}")
    print(
        f"{'spark-state + JVM':<22} {_fmt(bridge + jvm + warm)}   = JVM start {jvm:.2f}s + warm-up {warm:.2f}s "
        f"(first queries: workers, codegen, JIT) + best run"
    )
    print(
        f"ratio to the faster baseline ({base_name}): excluding JVM start {bridge / base:.2f}x "
        f"(worst run {max(runs['spark-state']) / base:.2f}x), including JVM start and warm-up "
        f"{(bridge + jvm + warm) / base:.2f}x  [target <= 3x excluding]"
    )
    print(
        f"  with partitioned_by_key (no shuffle of its own): excluding JVM start {fused_best / base:.2f}x, "
        f"including {(fused_best + jvm + warm) / base:.2f}x"
    )
    print("-" * 86)
    print("where the time goes")
    for name in ("baseline-writebatch", "baseline-sst"):
        print(f"  {name}: " + ", ".join(f"{k} {v:.2f}s" for k, v in parts[name].items() if k != "total"))
    tm = res.timings
    print(
        f"  spark-state (last run): Spark job {tm.get('spark', 0):.2f}s wall, build stores (SST ingest) "
        f"{tm.get('build', 0):.2f}s, publish {tm.get('publish', 0):.3f}s"
    )
    print(
        f"    Python CPU in tasks, summed over {args.cores} cores: stage A (encode, hash, place) "
        f"{tm.get('tasks_stage_a_cpu', 0):.2f}s, stage B (dedupe, SST files) {tm.get('tasks_stage_b_cpu', 0):.2f}s "
        f"(SST writing {tm.get('tasks_sst_write_cpu', 0):.2f}s)"
    )
    ft = results["spark-state-fused"].timings
    print(
        f"  spark-state-fused (last run): Spark job {ft.get('spark', 0):.2f}s wall, build stores (SST ingest + "
        f"uniqueness check) {ft.get('build', 0):.2f}s; Python CPU: stage A {ft.get('tasks_stage_a_cpu', 0):.2f}s, "
        f"sort + stage B {ft.get('tasks_stage_b_cpu', 0):.2f}s"
    )
    print(
        f"    rows into the bridge {res.rows_read:,}, keys written {res.keys_total:,}, "
        f"buckets {res.details['buckets']}, Spark partitions {res.details['spark_partitions']}"
    )
    if breakdown:
        print(
            "  the same job built up step by step (wall seconds of each cumulative run, best of 2; deltas in brackets):"
        )
        prev = 0.0
        for name, secs in breakdown:
            print(f"    {name:<50} {secs:6.2f}s  [{secs - prev:+.2f}s]")
            prev = secs
    if args.replay:
        rb, rs = best["baseline-replay"], best["spark-replay"]
        print("-" * 86)
        print(
            f"mode 2 (the handler replayed over every event): baseline-replay {rb:.2f}s, spark-replay {rs:.2f}s "
            f"(+ JVM {jvm:.2f}s): {rs / rb:.2f}x"
        )
        print(
            "  baseline-replay: "
            + ", ".join(f"{k} {v:.2f}s" for k, v in parts["baseline-replay"].items() if k != "total")
        )
        if replay_res is not None:
            rt = replay_res.timings
            print(
                f"  spark-replay: job {rt.get('spark', 0):.2f}s wall; Python CPU: stage A "
                f"{rt.get('tasks_stage_a_cpu', 0):.2f}s, stage B {rt.get('tasks_stage_b_cpu', 0):.2f}s "
                f"(handlers {rt.get('tasks_replay_cpu', 0):.2f}s, SST {rt.get('tasks_sst_write_cpu', 0):.2f}s); "
                f"build {rt.get('build', 0):.2f}s"
            )
    print("-" * 86)
    for name, (ok, n) in checks.items():
        print(f"stores of {name} == baseline-writebatch: {'yes' if ok else 'NO'} ({n:,} keys)")
    print("=" * 86)
    spark.stop()
    if not all(ok for ok, _ in checks.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
