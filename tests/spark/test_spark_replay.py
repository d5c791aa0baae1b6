"""The Spark bridge on local Spark (no broker): mode 2 (replay of the app's handlers) and
the store reader."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import bf_apps
import orjson
import pytest
from test_spark_backfill import PARTS, count_events, final_state, owned_positions, read_all, state_df

from stores.rocksdb import RocksDBStore
from streamkit.errors import ConfigError, ReplayError
from streamkit.spark import BackfillOptions, backfill_replay, backfill_table, read_stores
from streamkit.spark.placement import processor_of
from streamkit.spark.staging import live_store_dirs

# --------------------------------------------------------------------------- mode 2


def multi_records(n: int, keys: int, seed: int) -> list[tuple[int, int, str | None, int, int, int]]:
    """(key, amount, tag, partition, offset, ts) for the multi app (int keys)."""
    from stores.serde import IntSerde
    from streamkit.testing import default_partition

    rng = random.Random(seed)
    nxt = [0] * PARTS
    out = []
    for i in range(n):
        key = rng.randrange(-keys // 4, keys)
        part = default_partition(IntSerde().dumps(key), PARTS)
        amount = rng.randrange(0, 5)
        tag = rng.choice([None, None, f"t{i}"])
        out.append((key, amount, tag, part, nxt[part], 1000 * i))
        nxt[part] += 1
    return out


def multi_reference(records: list[tuple[int, int, str | None, int, int, int]]) -> tuple[dict[int, int], dict[int, str]]:
    sums: dict[int, int] = defaultdict(int)
    last: dict[int, str] = {}
    for key, amount, tag, *_ in records:
        sums[key] += amount
        if tag is not None:
            last[key] = tag
        elif key in last and amount == 0:
            del last[key]
    return dict(sums), last


def test_replay_runs_the_apps_handlers_per_key_in_order(spark: Any, state_dir: Path) -> None:
    from stores.serde import IntSerde

    records = multi_records(5000, 300, seed=7)
    shuffled = records[:]
    random.Random(1).shuffle(shuffled)  # the DataFrame's row order must not matter
    import pyspark.sql.functions as F

    df = spark.createDataFrame(shuffled, "key long, amount long, tag string, partition int, offset long, ts long")
    df = df.withColumn("value", F.struct("amount", "tag"))
    res = backfill_replay(
        bf_apps.multi,
        df,
        BackfillOptions(partition_col="partition", offset_col="offset", processors=3, state_dir=state_dir),
        timestamp_col="ts",
    )
    sums, last = multi_reference(records)
    stores = read_all(state_dir / "bf-multi", ["sums", "last"])
    assert sorted(stores) == [0, 1, 2]
    got_sums: dict[int, int] = {}
    got_last: dict[int, str] = {}
    ints = IntSerde()
    pos = {("m-events", p): n for p, n in enumerate(_counts_per_part(records))}
    owned = owned_positions([(ints.dumps(r[0]), "m-events", r[3]) for r in records], pos, 2, 3)
    for proc, (tables, cp) in stores.items():
        for k, v in tables["sums"].items():
            assert processor_of(k, 2, 3) == proc
            got_sums[ints.loads(k)] = orjson.loads(v)
        for k, v in tables["last"].items():
            assert processor_of(k, 2, 3) == proc
            got_last[ints.loads(k)] = v.decode()
        assert cp.positions == owned[proc]
    assert got_sums == sums
    assert got_last == last
    assert res.rows_read == len(records)
    assert res.keys_written == {"sums": len(sums), "last": len(last)}


def _counts_per_part(records: list[tuple[Any, ...]]) -> list[int]:
    c = [0] * PARTS
    for r in records:
        c[r[3]] += 1
    return c


def test_replay_builds_windowed_tables(spark: Any, state_dir: Path) -> None:
    from stores.serde import StrSerde
    from streamkit.windows import WindowKeySerde

    rows = [(f"k{i % 7}", i % 5, 0, i, 1_700_000_000_000 + i * 7_000) for i in range(600)]
    df = spark.createDataFrame(rows, "key string, amount long, partition int, offset long, ts long")
    import pyspark.sql.functions as F

    # the timestamp as a Spark TIMESTAMP column (converted to epoch ms for ctx.timestamp)
    df = df.withColumn("ts", F.timestamp_millis("ts"))
    backfill_replay(
        bf_apps.windowed,
        df.withColumn("value", F.struct("amount")),
        BackfillOptions(partition_col="partition", offset_col="offset", state_dir=state_dir),
        timestamp_col="ts",
    )
    want: dict[tuple[str, int], int] = defaultdict(int)
    for key, amount, _, _, ts in rows:
        want[(key, ts - ts % 60_000)] += amount
    ks = WindowKeySerde(StrSerde())
    got = {}
    for _, (tables, _) in read_all(state_dir / "bf-windowed", ["per_minute"]).items():
        for k, v in tables["per_minute"].items():
            got[ks.loads(k)] = orjson.loads(v)
    assert got == dict(want)


def test_replay_refuses_a_handler_touching_another_key(spark: Any, state_dir: Path) -> None:
    df = spark.createDataFrame(
        [("a", "{}", 0, 0), ("b", "{}", 0, 1)], "key string, value string, partition int, offset long"
    )
    with pytest.raises(ReplayError, match="touched key 'grand-total'") as info:
        backfill_replay(
            bf_apps.bad,
            df,
            BackfillOptions(value_encoded=True, partition_col="partition", offset_col="offset", state_dir=state_dir),
        )
    assert "Traceback" not in str(info.value) and "\n" not in str(info.value)
    assert live_store_dirs(state_dir / "bf-bad") == {}
    with pytest.raises(ConfigError, match="per-processor timers .*t_decay"):
        backfill_replay(
            bf_apps.timed,
            df,
            BackfillOptions(value_encoded=True, partition_col="partition", offset_col="offset", state_dir=state_dir),
        )


# --------------------------------------------------------------------------- reader


def test_read_stores_one_partition_per_store(spark: Any, state_dir: Path) -> None:
    events = count_events(2000, 300, seed=8)
    backfill_table(
        bf_apps.counts,
        "totals",
        state_df(spark, events),
        BackfillOptions(offset_col="offset", partition_col="partition", processors=4, state_dir=state_dir),
    )
    raw = read_stores(spark, bf_apps.counts, "totals", state_dir=state_dir)
    assert raw.rdd.getNumPartitions() == 4
    rows = raw.collect()
    assert {r.key.decode(): orjson.loads(r.value) for r in rows} == final_state(events)
    assert all(processor_of(bytes(r.key), 3, 4) == r.processor for r in rows)
    decoded = read_stores(spark, "bf_apps:counts", "totals", decode=True, state_dir=state_dir)
    assert decoded.schema.simpleString() == "struct<processor:int,key:string,value:string>"
    assert sorted((r.key, r.value) for r in decoded.collect()) == sorted(
        (r.key.decode(), r.value.decode()) for r in rows
    )
    # stores are read read-only: it works while a processor holds one
    held = RocksDBStore.open(str(state_dir / "bf-counts" / "processor-1"), ["totals"])
    try:
        by_path = read_stores(spark, path=state_dir / "bf-counts" / "processor-1", table="totals")
        assert by_path.count() == sum(1 for r in rows if r.processor == 1)
    finally:
        held.close()
