"""Micro-benchmark of the state hot path (not collected by pytest).

    python tests/stores/bench_cache.py [--keys 10000] [--ops 1000000]

Prints:
- get+set pairs/s on hot keys through CachedTable (``t[k] = t.get(k, 0) + 1``),
  next to a plain dict (the floor) and per-record rocksdict get+put with
  orjson (what a cache-less table would pay);
- the cost of one checkpoint per 10k dirty keys: ``pending()`` (serialise),
  ``store.commit`` (one RocksDB WriteBatch, sync off / on), ``mark_clean``,
  with glibc's default malloc and after ``stores.relax_malloc_trim()``;
- cold misses/s (store read + decode + negative/positive cache fill).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from stores import CachedTable, Checkpoint, RocksDBStore, relax_malloc_trim


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds / 1e6:6.2f} M/s" if n / seconds >= 1e6 else f"{n / seconds / 1e3:6.0f} k/s"


def bench_hot(store: RocksDBStore, keys: int, ops: int) -> None:
    t = CachedTable(store, "t", "int", "json")
    for k in range(keys):
        t[k] = 0
    t0 = time.perf_counter()
    i = 0
    while i < ops:
        k = i % keys
        t[k] = t.get(k, 0) + 1
        i += 1
    el = time.perf_counter() - t0
    d: dict[int, int] = {}
    t0 = time.perf_counter()
    i = 0
    while i < ops:
        k = i % keys
        d[k] = d.get(k, 0) + 1
        i += 1
    el_dict = time.perf_counter() - t0
    t.discard()

    raw = store._cfs["t"]  # the rocksdict column family: what a cache-less table would do
    n_raw = min(ops, 200_000)
    kb = [k.to_bytes(8, "big", signed=True) for k in range(keys)]
    t0 = time.perf_counter()
    for i in range(n_raw):
        key = kb[i % keys]
        v = raw.get(key)
        raw.put(key, orjson.dumps((orjson.loads(v) if v is not None else 0) + 1))
    el_raw = time.perf_counter() - t0
    print(f"hot get+set, {keys} keys, {ops} pairs:")
    print(f"  CachedTable (json values)        {rate(ops, el)}   ({el / ops * 1e9:5.0f} ns per pair)")
    print(f"  plain dict (floor)               {rate(ops, el_dict)}   ({el_dict / ops * 1e9:5.0f} ns per pair)")
    print(f"  rocksdict get+put+orjson/record  {rate(n_raw, el_raw)}   ({el_raw / n_raw * 1e9:5.0f} ns per pair)")


def bench_checkpoint(store: RocksDBStore, dirty: int, rounds: int, label: str) -> None:
    """Median wall and thread-CPU time per phase (CPU time is what the processor
    thread pays; wall time also counts other load on a shared machine)."""
    t = CachedTable(store, "t", "int", "json", max_cached=10 * dirty)
    phases: dict[str, list[tuple[float, float]]] = {"pending": [], "commit": [], "mark_clean": []}
    clock = time.perf_counter
    cpu = time.thread_time
    base = 0
    for r in range(rounds):
        for k in range(dirty):
            t[k + base] = {"count": r, "sum": k * r}
        base += dirty // 2  # half the keys new each round, half updated
        w0, c0 = clock(), cpu()
        changes = {"t": t.pending()}
        w1, c1 = clock(), cpu()
        store.commit(changes, Checkpoint(positions={("in", 0): r}))
        w2, c2 = clock(), cpu()
        t.mark_clean()
        w3, c3 = clock(), cpu()
        phases["pending"].append((w1 - w0, c1 - c0))
        phases["commit"].append((w2 - w1, c2 - c1))
        phases["mark_clean"].append((w3 - w2, c3 - c2))
    med = statistics.median
    parts = []
    tot_w = tot_c = 0.0
    for name, xs in phases.items():
        w, c = med(x[0] for x in xs), med(x[1] for x in xs)
        tot_w += w
        tot_c += c
        parts.append(f"{name} {w * 1e3:5.2f}/{c * 1e3:5.2f}")
    print(
        f"checkpoint of {dirty} dirty keys ({label}), ms wall/cpu: "
        + ", ".join(parts)
        + f"; total {tot_w * 1e3:5.2f}/{tot_c * 1e3:5.2f} ms"
        + f" ({tot_c / dirty * 1e9:4.0f} ns/key cpu, median of {rounds})"
    )


def bench_misses(store: RocksDBStore, n: int) -> None:
    store.commit({"t": {i.to_bytes(8, "big", signed=True): b"1" for i in range(0, n, 2)}}, Checkpoint())
    t = CachedTable(store, "t", "int", "json", max_cached=2 * n)
    t0 = time.perf_counter()
    for i in range(n):
        t.get(i)
    el = time.perf_counter() - t0
    print(f"cold misses (half absent): {rate(n, el)}  ({el / n * 1e9:5.0f} ns each)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--section", choices=["all", "hot", "checkpoint", "misses"], default="all")
    ap.add_argument("--relax", action="store_true", help="call stores.relax_malloc_trim() first")
    ap.add_argument("--sync", action="store_true")
    args = ap.parse_args()
    if args.section == "all":
        # Each section in a fresh process: malloc state carries over otherwise.
        me = [sys.executable, __file__, "--keys", str(args.keys), "--ops", str(args.ops), "--rounds", str(args.rounds)]
        for extra in (
            ["--section", "hot"],
            ["--section", "checkpoint"],
            ["--section", "checkpoint", "--relax"],
            ["--section", "checkpoint", "--relax", "--sync"],
            ["--section", "misses"],
        ):
            subprocess.run(me + extra, check=True)
        return
    if args.relax:
        relax_malloc_trim()
    tmp = Path(tempfile.mkdtemp(prefix="stores-bench-"))
    try:
        with RocksDBStore.open(tmp / "s", ["t"], sync=args.sync) as store:
            if args.section == "hot":
                bench_hot(store, args.keys, args.ops)
            elif args.section == "checkpoint":
                label = f"sync={args.sync}, {'relax_malloc_trim' if args.relax else 'default malloc'}"
                bench_checkpoint(store, args.keys, args.rounds, label)
            else:
                bench_misses(store, 100_000)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
