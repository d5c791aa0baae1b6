"""The task functions in-process (no JVM), with tiny Arrow batches so that keys and
duplicate runs straddle batch boundaries."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from stores.base import Checkpoint
from stores.rocksdb import RocksDBStore
from stores.serde import JsonSerde, StrSerde
from streamkit.spark import tasks
from streamkit.spark.placement import processor_of
from streamkit.spark.shuffle import _timed, spark_partition_keys


def _spec(tmp: Path, mode: str, p: int, subs: int, **kw: Any) -> tasks.Spec:
    root = tmp / "sst"
    for proc in range(p):
        for t in ("totals",):
            (root / f"processor-{proc}" / t).mkdir(parents=True, exist_ok=True)
    return tasks.Spec(
        mode=mode, p0=p, p=p, subs=subs, sst_root=str(root), extra={"sp_keys": spark_partition_keys(2)}, **kw
    )


def _read_ssts(rows: list[dict[str, Any]], tmp: Path) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for i, r in enumerate(x for x in rows if x["kind"] == "sst"):
        store = RocksDBStore.create_from_sst(str(tmp / f"check-{i}"), ["totals"], {"totals": [r["path"]]}, Checkpoint())
        try:
            for k, v in store.items("totals"):
                assert k not in out
                assert processor_of(k, 3, 3) == r["proc"]
                out[k] = v
        finally:
            store.close()
    return out


def _stage_a(fn: Any, spec: tasks.Spec, table: pa.Table, *head: Any) -> pa.Table:
    return pa.Table.from_batches(list(_timed(fn, None, 0, spec, *head, iter(table.to_batches(max_chunksize=7)))))


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 64])
def test_write_state_dedupes_across_batch_boundaries(tmp_path: Path, batch: int) -> None:
    rng = random.Random(batch)
    rows = []
    for i in range(400):
        key = f"k{rng.randrange(60)}"
        value = None if rng.random() < 0.1 else {"count": i, "sum": rng.randrange(9)}
        rows.append((key, value, 0, i))
    table = pa.table(
        {
            "key": [r[0] for r in rows],
            "value": [r[1] for r in rows],
            "partition": [r[2] for r in rows],
            "offset": [r[3] for r in rows],
        }
    )
    spec = _spec(
        tmp_path,
        "state",
        3,
        2,
        key_col="key",
        value_col="value",
        topic="events",
        partition_col="partition",
        offset_col="offset",
        tables=(tasks.TableCodec("totals", StrSerde(), JsonSerde()),),
    )
    a = _stage_a(tasks.place_state, spec, table, 0)
    a = a.take(
        pc.sort_indices(a, [("_b", "ascending"), ("_t", "ascending"), ("_k", "ascending"), ("_off", "ascending")])
    )
    meta = pa.Table.from_batches(list(tasks.write_state(spec, iter(a.drop(["_sp"]).to_batches(max_chunksize=batch)))))
    got = _read_ssts(meta.to_pylist(), tmp_path)
    latest: dict[str, Any] = {}
    for key, value, _, _ in rows:
        latest[key] = value
    want = {k.encode(): orjson.dumps(v) for k, v in latest.items() if v is not None}
    assert got == want
    stats = next(r for r in meta.to_pylist() if r["kind"] == "stats")
    assert stats["rows"] == len(rows)
    assert f"dups={len(rows) - len(latest)}" in stats["info"]
    assert f"nulls={sum(1 for v in latest.values() if v is None)}" in stats["info"]


@pytest.mark.parametrize("batch", [1, 2, 3, 7, 1000])
def test_write_replay_keeps_each_keys_records_together_across_batches(tmp_path: Path, batch: int) -> None:
    rng = random.Random(batch)
    rows = [(f"user-{rng.randrange(40)}", {"amount": rng.randrange(10)}, 0, i, 1000 * i) for i in range(500)]
    table = pa.table(
        {
            "key": [r[0] for r in rows],
            "value": [r[1] for r in rows],
            "partition": [r[2] for r in rows],
            "offset": [r[3] for r in rows],
            "ts": [r[4] for r in rows],
            "o0": [r[3] for r in rows],
        }
    )
    spec = _spec(
        tmp_path,
        "replay",
        3,
        1,
        key_col="key",
        value_col="value",
        topic="events",
        partition_col="partition",
        offset_col="offset",
        timestamp_col="ts",
        order_cols=("o0",),
        key_serde=StrSerde(),
        value_serde=JsonSerde(),
        app_ref="bf_apps:counts",
        tables=(tasks.TableCodec("totals", StrSerde(), JsonSerde()),),
    )
    a = _stage_a(tasks.place_replay, spec, table)
    h = pa.array([hash(k) for k in a["_k"].to_pylist()], pa.int64())  # any hash: keys must only be contiguous
    a = a.append_column("_h", h)
    a = a.take(pc.sort_indices(a, [("_h", "ascending"), ("_k", "ascending"), ("_o0", "ascending")]))
    meta = list(tasks.write_replay(spec, iter(a.drop(["_sp", "_h"]).to_batches(max_chunksize=batch))))
    got = _read_ssts(pa.Table.from_batches(meta).to_pylist(), tmp_path)
    want: dict[str, dict[str, int]] = defaultdict(lambda: {"count": 0, "sum": 0})
    for key, value, *_ in rows:
        want[key] = {"count": want[key]["count"] + 1, "sum": want[key]["sum"] + value["amount"]}
    assert {k.decode(): orjson.loads(v) for k, v in got.items()} == want
