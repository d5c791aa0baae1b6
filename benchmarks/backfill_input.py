"""The input of the backfill benchmark: the app and the generated events (Parquet)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

PARTITIONS = 8
TOPIC = "events"


# --------------------------------------------------------------------------- the app


def make_app(name: str, state_dir: str, processors: int) -> Any:
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

WARMUP_EVENTS, WARMUP_KEYS = 500_000, 100_000  # a small input of the same shape, for Spark's first queries


def cached_input(workdir: Path, events: int, keys: int) -> Path:
    """The Parquet file of ``events`` into ``keys`` under ``workdir``, generated on first use
    and kept: every benchmark of the backfill reads the same files."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"events-{events}-{keys}.parquet"
    if not path.exists():
        print(f"generating {path} ...", flush=True)
        make_input(path, events, keys)
    return path


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
