"""The benchmark input: deterministic records, prepared once per harness run.

Record i (0 <= i < N): key ``b"key-%d" % k`` where k runs over ``i % K`` shuffled by
``random.Random(seed)`` (so every key occurs N/K times, in a deterministic order), value
``orjson.dumps({"amount": (i * 7919) % 1000, "seq": i})``. Keys are placed by Kafka's
default partitioner (murmur2). A smaller input of n records (for a contender given a
fraction of the work) is the first n records of the same sequence.

Every topic gets a streamkit layout of P partitions (adopted as Kafka placed it, as
``streamkit topics create`` would; other clients do not see it). The *stamped* input
holds the same records, stamped as streamkit's producer stamps them (one header on the
first record of each batch): batches and placement are the same, so a contender
reading it differs from one reading the plain input only by the stamp.

``prepare_topic`` creates the topic and produces the records with several producer
processes in parallel (each owns a disjoint set of partitions, so each partition's
order is the order of i).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time
from dataclasses import dataclass

from streamkit.layout.stamps import stamp

SEED = 20240611

__all__ = ["InputSpec", "amount", "expected_check", "key_indices", "prepare_topic"]


def amount(i: int) -> int:
    return (i * 7919) % 1000


@dataclass(frozen=True)
class InputSpec:
    records: int
    keys: int
    partitions: int
    seed: int = SEED


_KEY_CACHE: dict[tuple[int, int, int], list[int]] = {}


def key_indices(records: int, keys: int, seed: int = SEED) -> list[int]:
    """k for every record i of the full input: ``i % keys`` for i < records, shuffled."""
    cache_key = (records, keys, seed)
    if cache_key not in _KEY_CACHE:
        ks = [i % keys for i in range(records)]
        random.Random(seed).shuffle(ks)
        _KEY_CACHE[cache_key] = ks
    return _KEY_CACHE[cache_key]


def expected_check(ks: list[int], n: int) -> dict[str, int]:
    """The check every contender must report for the first ``n`` records."""
    return {"keys": len(set(ks[:n])), "count": n, "sum": sum(amount(i) for i in range(n))}


# --------------------------------------------------------------------------- production

BENCH_TAG = b"bench0"
"""The producer tag of the stamped input (six characters, like a producer's)."""


async def _create(bootstrap: str, topic: str, partitions: int) -> int:
    """Create the topic and its layout; the layout's epoch."""
    from streamkit.layout.protocol import LayoutCoordinator

    async with LayoutCoordinator(bootstrap) as coord:
        return (await coord.create(topic, partitions)).epoch


_WORK: dict = {}  # set in the parent before forking producers
CHUNK = 1_000_000
"""Records built and produced at a time by each producer process."""


def _produce_worker(worker: int, workers: int) -> int:
    from streamkit.testing import produce_json

    bootstrap, topic, n, ks, placement, headers = (
        _WORK["bootstrap"],
        _WORK["topic"],
        _WORK["n"],
        _WORK["ks"],
        _WORK["placement"],
        _WORK["headers"],
    )
    written = 0
    for start in range(0, n, CHUNK):  # in chunks: 10M records at once outgrew 24 GiB
        records = [
            # what orjson.dumps({"amount": ..., "seq": i}) gives, without its ~4 KiB heap per live result
            (b"key-%d" % ks[i], b'{"amount":%d,"seq":%d}' % ((i * 7919) % 1000, i), placement[ks[i]])
            for i in range(start, min(n, start + CHUNK))
            if placement[ks[i]] % workers == worker
        ]
        written += produce_json(bootstrap, topic, records, batch_headers=headers, batch_bytes=512 * 1024)
    return written


def prepare_topic(
    bootstrap: str,
    topic: str,
    spec: InputSpec,
    records: int | None = None,
    *,
    producers: int = 1,
    stamped: bool = False,
) -> tuple[int, float]:
    """Create ``topic`` with its layout and fill it with the first ``records`` (default
    all) records of the input ``spec``, ``stamped`` or not. Returns (records written,
    seconds)."""
    from streamkit.testing import default_partition

    n = spec.records if records is None else records
    ks = key_indices(spec.records, spec.keys, spec.seed)
    placement = [default_partition(b"key-%d" % k, spec.partitions) for k in range(spec.keys)]
    epoch = asyncio.run(_create(bootstrap, topic, spec.partitions))
    headers = [stamp(BENCH_TAG, epoch)] if stamped else None
    started = time.perf_counter()
    workers = max(1, min(producers, spec.partitions))
    _WORK.update(bootstrap=bootstrap, topic=topic, n=n, ks=ks, placement=placement, headers=headers)
    try:
        if workers == 1:
            written = _produce_worker(0, 1)
        else:
            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(workers) as pool:
                written = sum(pool.starmap(_produce_worker, [(w, workers) for w in range(workers)]))
    finally:
        _WORK.clear()
    if written != n:
        raise RuntimeError(f"prepared {written} records into {topic}, expected {n}")
    return written, time.perf_counter() - started
