"""Fraction of keys that change partition when a topic grows: linear hashing vs
Kafka's modulo placement.

    python -m benchmarks.keys_moved [--keys 200000] [--min 4] [--max 64] [--seed 1]

For every N in [min, max], random keys are hashed once with the vectorised murmur2
(:func:`assignors.vectorized.key_hash_batch`) and placed before and after growth
N -> N+1 and N -> 2N by

- Kafka: ``h % N`` (the default partitioner; every expansion reshuffles);
- LH(n0=N): linear hashing of a topic created with N partitions;
- LH(n0=4): linear hashing of a topic created with 4 partitions and grown to N.

Also shown: the share of keys Kafka moves between partitions that existed before
(each such move needs the two old partitions to block each other; linear hashing
never does this), and linear hashing's price: uneven partition sizes while a round
of splits is in progress (largest partition / mean, LH(n0=4) at N).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import numpy.typing as npt
from rich.console import Console
from rich.table import Table

from assignors.linear_hashing import lh_bucket_batch
from assignors.vectorized import key_hash_batch

Hashes = npt.NDArray[np.uint32]


def random_keys(count: int, seed: int) -> list[bytes]:
    """``count`` random keys of 4..24 bytes."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, 25, size=count)
    blob = rng.integers(0, 256, size=int(lengths.sum()), dtype=np.uint8).tobytes()
    ends = np.cumsum(lengths).tolist()
    starts = [0, *ends[:-1]]
    return [blob[a:b] for a, b in zip(starts, ends)]


def moved(before: npt.NDArray[np.integer], after: npt.NDArray[np.integer]) -> float:
    """Fraction of keys whose partition changed."""
    return float(np.count_nonzero(before != after)) / before.size


def row(h: Hashes, n: int) -> dict[str, float]:
    """All measured fractions for one starting count ``n``."""
    kafka = h % np.uint32(n)
    kafka1 = h % np.uint32(n + 1)
    kafka2 = h % np.uint32(2 * n)
    lh4 = lh_bucket_batch(h, 4, n)
    lh4_1 = lh_bucket_batch(h, 4, n + 1)
    sizes = np.bincount(lh4, minlength=n)
    return {
        "lh4+1_old": float(np.count_nonzero((lh4 != lh4_1) & (lh4_1 < n))) / h.size,
        "kafka+1": moved(kafka, kafka1),
        "kafka+1_old": float(np.count_nonzero((kafka != kafka1) & (kafka1 < n))) / h.size,
        "lhN+1": moved(kafka, lh_bucket_batch(h, n, n + 1)),  # LH(h, n, n) == h % n
        "lh4+1": moved(lh4, lh4_1),
        "kafka*2": moved(kafka, kafka2),
        "lhN*2": moved(kafka, lh_bucket_batch(h, n, 2 * n)),
        "lh4*2": moved(lh4, lh_bucket_batch(h, 4, 2 * n)),
        "skew": float(sizes.max()) / (h.size / n),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--min", type=int, default=4, dest="lo")
    parser.add_argument("--max", type=int, default=64, dest="hi")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    keys = random_keys(args.keys, args.seed)
    key_hash_batch(keys[:10])  # warm up (imports pyarrow when installed)
    t0 = time.perf_counter()
    h = key_hash_batch(keys)
    hash_s = time.perf_counter() - t0
    rows = {n: row(h, n) for n in range(args.lo, args.hi + 1)}

    pct = "{:.1%}".format
    table = Table(
        title=f"Keys moved by partition growth ({args.keys:,} random keys)",
        caption="+1: N -> N+1, x2: N -> 2N; LH(N) / LH(4): linear hashing, topic created "
        "with N / 4 partitions; ->old: moved between partitions existing before; "
        "skew: largest partition / mean, LH(4) at N",
    )
    for col in ("N", "+1 Kafka", "->old", "+1 LH(N)", "+1 LH(4)", "x2 Kafka", "x2 LH(N)", "x2 LH(4)", "skew"):
        table.add_column(col, justify="right")
    for n, r in rows.items():
        table.add_row(
            str(n),
            pct(r["kafka+1"]),
            pct(r["kafka+1_old"]),
            pct(r["lhN+1"]),
            pct(r["lh4+1"]),
            pct(r["kafka*2"]),
            pct(r["lhN*2"]),
            pct(r["lh4*2"]),
            f"{r['skew']:.2f}x",
        )
    console = Console()
    console.print(table)

    def mean(col: str) -> float:
        return sum(r[col] for r in rows.values()) / len(rows)

    worst_skew = max(r["skew"] for r in rows.values())
    lh_to_old = max(r["lh4+1_old"] for r in rows.values())
    console.print(
        f"N={args.lo}..{args.hi}, N->N+1: Kafka moves {mean('kafka+1'):.1%} of keys on "
        f"average ({mean('kafka+1_old'):.1%} between existing partitions), linear hashing "
        f"{mean('lhN+1'):.1%} (n0=N) / {mean('lh4+1'):.1%} (n0=4; at most {lh_to_old:.1%} "
        f"between existing partitions); N->2N: Kafka {mean('kafka*2'):.1%}, LH "
        f"{mean('lhN*2'):.1%} / {mean('lh4*2'):.1%}; LH n0=4 largest partition up to "
        f"{worst_skew:.2f}x the mean (hashing: {args.keys / hash_s / 1e6:.1f}M keys/s)",
        soft_wrap=True,
    )


if __name__ == "__main__":
    main()
