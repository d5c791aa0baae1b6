"""Writer process for the SIGKILL crash test (tests/stores/test_stores_crash.py).

Applies a deterministic stream of keyed updates through CachedTable and
checkpoints every ``--every`` records.  Record ``i`` (0, 1, 2, ...) touches key
``k = i % KEYS`` in three tables:

- ``sums[k]  += i``            (running sum: a replayed record changes it)
- ``counts[k] += 1``
- ``last[k] = {"i": i}``, or *deleted* when ``i % 3 == 0`` (exercises deletes)

The checkpoint's position ("in", 0) is the number of records applied.  On
start the writer resumes from the store's checkpoint, prints ``START <pos>``
and then ``C <pos>`` after every commit, until killed (or ``--total``).

``--mode split`` is the deliberately broken control: it commits each key
separately, every piece already carrying the new checkpoint, so a kill in the
middle leaves a checkpoint that claims records whose updates are partly
missing.  The crash test must catch that.

Run: python tests/stores/crash_writer.py --path DIR [--every N] [--mode atomic|split]
"""

from __future__ import annotations

import argparse
import sys

from stores import CachedTable, Checkpoint, RocksDBStore, commit_cached

KEYS = 500
TABLES = ("sums", "counts", "last")
TOPIC = ("in", 0)


def small_memtables(opts) -> None:  # type: ignore[no-untyped-def]
    # Flushes (and compactions) every few commits, so kills also land in them.
    opts.set_write_buffer_size(64 * 1024)
    opts.set_level_zero_file_num_compaction_trigger(2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", required=True)
    ap.add_argument("--every", type=int, default=300)
    ap.add_argument("--total", type=int, default=10**12)
    ap.add_argument("--mode", choices=["atomic", "split"], default="atomic")
    args = ap.parse_args(argv)

    store = RocksDBStore.open(args.path, TABLES, configure=small_memtables)
    pos = store.checkpoint().position(*TOPIC)
    sums = CachedTable(store, "sums", "int", "int")
    counts = CachedTable(store, "counts", "int", "json")
    last = CachedTable(store, "last", "int", "json")
    tables = [sums, counts, last]
    out = sys.stdout
    out.write(f"START {pos}\n")
    out.flush()
    every = args.every
    i = pos
    while i < args.total:
        k = i % KEYS
        sums[k] = sums.get(k, 0) + i
        counts[k] = counts.get(k, 0) + 1
        if i % 3 == 0:
            last.pop(k, None)
        else:
            last[k] = {"i": i}
        i += 1
        if i % every == 0:
            cp = Checkpoint(positions={TOPIC: i}, extra={"records": i})
            if args.mode == "atomic":
                commit_cached(store, tables, cp)
            else:
                for t in tables:
                    for kb, vb in t.pending().items():
                        store.commit({t.table: {kb: vb}}, cp)
                    t.mark_clean()
            out.write(f"C {i}\n")
            out.flush()
    store.close()
    out.write("DONE\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
