"""The Spark bridge end to end on local Spark (no broker): mode 1 (state), safety."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import bf_apps
import orjson
import pytest

from stores.base import Checkpoint
from stores.rocksdb import RocksDBStore
from streamkit.errors import ConfigError
from streamkit.spark import BackfillError, BackfillOptions, BackfillRefused, backfill_state, backfill_table
from streamkit.spark.partitioning import hash_partitioned_by
from streamkit.spark.placement import processor_of
from streamkit.spark.shuffle import _murmur3_int, spark_partition_keys
from streamkit.spark.staging import BACKFILL_DIR, InjectedFailure, live_store_dirs

PARTS = 4


def read_all(app_dir: Path, tables: list[str]) -> dict[int, tuple[dict[str, dict[bytes, bytes]], Checkpoint]]:
    out = {}
    for proc, path in live_store_dirs(app_dir).items():
        store = RocksDBStore.open(str(path), tables, create=False)
        try:
            out[proc] = ({t: dict(store.items(t)) for t in tables}, store.checkpoint())
        finally:
            store.close()
    return out


def count_events(n: int, keys: int, seed: int = 1) -> list[tuple[str, int, int, int, int]]:
    """(key, amount, partition, offset, ts) with Kafka-like offsets per partition."""
    from streamkit.testing import default_partition

    rng = random.Random(seed)
    next_off = [0] * PARTS
    out = []
    for i in range(n):
        key = f"user-{rng.randrange(keys)}"
        part = default_partition(key.encode(), PARTS)
        out.append((key, rng.randrange(100), part, next_off[part], 1_700_000_000_000 + i * 1000))
        next_off[part] += 1
    return out


def final_state(events: list[tuple[str, int, int, int, int]]) -> dict[str, dict[str, int]]:
    state: dict[str, dict[str, int]] = {}
    for key, amount, *_ in events:
        row = state.get(key) or {"count": 0, "sum": 0}
        state[key] = {"count": row["count"] + 1, "sum": row["sum"] + amount}
    return state


def next_positions(events: list[tuple[str, int, int, int, int]]) -> dict[tuple[str, int], int]:
    pos: dict[tuple[str, int], int] = {}
    for _, _, part, off, _ in events:
        pos[("events", part)] = max(pos.get(("events", part), 0), off + 1)
    return pos


def state_df(spark: Any, events: list[tuple[str, int, int, int, int]]) -> Any:
    import pyspark.sql.functions as F

    ev = spark.createDataFrame(events, "key string, amount long, partition int, offset long, ts long")
    return ev.groupBy("key").agg(
        F.struct(F.count("*").alias("count"), F.sum("amount").alias("sum")).alias("value"),
        F.max("offset").alias("offset"),
        F.first("partition").alias("partition"),
    )


def owned_positions(
    keys_parts: list[tuple[bytes, str, int]], positions: dict[tuple[str, int], int], p0: int, p: int
) -> dict[int, dict[tuple[str, int], int]]:
    """Per processor: the positions of the partitions it owns keys of (what a checkpoint holds)."""
    owned: dict[int, dict[tuple[str, int], int]] = {proc: {} for proc in range(p)}
    for key, topic, part in keys_parts:
        owned[processor_of(key, p0, p)][(topic, part)] = positions[(topic, part)]
    return owned


def check_counts_stores(
    app_dir: Path, events: list[tuple[str, int, int, int, int]], p0: int, p: int, everywhere: bool = False
) -> None:
    stores = read_all(app_dir, ["totals"])
    assert sorted(stores) == list(range(p))
    want = final_state(events)
    seen = {}
    pos = next_positions(events)
    owned = owned_positions([(e[0].encode(), "events", e[2]) for e in events], pos, p0, p)
    for proc, (tables, cp) in stores.items():
        assert cp.positions == (pos if everywhere else owned[proc])
        for k, v in tables["totals"].items():
            assert processor_of(k, p0, p) == proc, f"{k!r} in the wrong store"
            seen[k.decode()] = orjson.loads(v)
    assert seen == want


# --------------------------------------------------------------------------- mode 1


def test_spark_partition_keys_match_the_jvm(spark: Any) -> None:
    import pyspark.sql.functions as F

    vals = list(range(-3, 50)) + [2**31 - 1, -(2**31)]
    got = spark.createDataFrame([(v,) for v in vals], "x int").select(F.hash("x").alias("h")).collect()
    assert [r.h for r in got] == [_murmur3_int(v) for v in vals]
    for n in (2, 3, 5):
        keys = spark_partition_keys(n)
        df = spark.createDataFrame([(k,) for k in keys], "x int").repartition(n, "x")
        rows = df.select("x", F.spark_partition_id().alias("pid")).collect()
        assert {r.x: r.pid for r in rows} == {k: i for i, k in enumerate(keys)}


def test_state_backfill_places_encodes_and_stamps_positions(spark: Any, state_dir: Path) -> None:
    events = count_events(6000, 700)
    df = state_df(spark, events)
    res = backfill_table(
        bf_apps.counts,
        "totals",
        df,
        BackfillOptions(offset_col="offset", partition_col="partition", state_dir=state_dir),
    )
    app_dir = state_dir / "bf-counts"
    check_counts_stores(app_dir, events, 3, 3)
    assert res.rows_read == len(final_state(events)) == res.keys_written["totals"]
    assert res.stores_published == 3
    assert res.positions == next_positions(events)
    first = read_all(app_dir, ["totals"])
    # re-running the same backfill gives the same stores (contents and checkpoints)
    res2 = backfill_table(
        bf_apps.counts,
        "totals",
        df,
        BackfillOptions(offset_col="offset", partition_col="partition", state_dir=state_dir),
    )
    assert res2.run_id != res.run_id
    assert read_all(app_dir, ["totals"]) == first
    assert sorted(os.listdir(app_dir / BACKFILL_DIR)) == ["lock"]


def test_state_backfill_without_shuffle_for_input_partitioned_by_key(spark: Any, state_dir: Path) -> None:
    events = count_events(5000, 600, seed=9)
    df = state_df(spark, events)  # groupBy(key) output: every key in one partition
    res = backfill_table(
        bf_apps.counts,
        "totals",
        df,
        BackfillOptions(offset_col="offset", partition_col="partition", state_dir=state_dir),
        partitioned_by_key=True,
    )
    check_counts_stores(state_dir / "bf-counts", events, 3, 3)
    assert res.keys_written["totals"] == len(final_state(events))
    # a DataFrame that breaks the promise is caught before anything is published
    rows = [(f"k{i % 40}", i, 0, i) for i in range(400)]
    spread = spark.createDataFrame(rows, "key string, value long, partition int, offset long").repartition(3)
    with pytest.raises(BackfillError, match="not partitioned by key"):
        backfill_table(
            bf_apps.counts,
            "totals",
            spread,
            BackfillOptions(offset_col="offset", partition_col="partition", state_dir=state_dir),
            partitioned_by_key=True,
        )
    check_counts_stores(state_dir / "bf-counts", events, 3, 3)


def test_a_dataframe_spark_partitions_by_key_is_written_where_it_is(spark: Any, state_dir: Path) -> None:
    events = count_events(3000, 300, seed=4)
    grouped = state_df(spark, events)  # groupBy(key) output
    rows = spark.createDataFrame([(f"k{i}", i) for i in range(50)], "key string, value long")
    assert hash_partitioned_by(grouped, "key")
    assert hash_partitioned_by(grouped.withColumnRenamed("key", "customer"), "customer")  # (the bridge renames)
    assert hash_partitioned_by(rows.repartition(3, "key"), "key")
    assert not hash_partitioned_by(rows.repartition(3), "key")
    assert not hash_partitioned_by(rows.repartition(3, "value"), "key")
    assert not hash_partitioned_by(rows, "key")
    joined = rows.repartition(3, "key").join(rows.repartition(3, "key").withColumnRenamed("value", "v2"), "key")
    assert not hash_partitioned_by(joined, "key")  # adaptive execution may split a join's partitions
    assert not hash_partitioned_by(rows.hint("rebalance", "key"), "key")  # and a rebalance's
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"  # (off only while planning)
    res = backfill_table(
        bf_apps.counts,
        "totals",
        grouped,
        BackfillOptions(offset_col="offset", partition_col="partition", state_dir=state_dir),
    )
    assert res.details["partitioned_by_key"] is True  # no shuffle of its own, by default
    check_counts_stores(state_dir / "bf-counts", events, 3, 3)
    res = backfill_table(
        bf_apps.counts,
        "totals",
        grouped,
        BackfillOptions(offset_col="offset", partition_col="partition", state_dir=state_dir),
        partitioned_by_key=False,
    )
    assert res.details["partitioned_by_key"] is False
    check_counts_stores(state_dir / "bf-counts", events, 3, 3)
    spread = grouped.repartition(4)  # the same rows, no longer by key: shuffled by the bridge
    res = backfill_table(
        bf_apps.counts,
        "totals",
        spread,
        BackfillOptions(offset_col="offset", partition_col="partition", state_dir=state_dir),
    )
    assert res.details["partitioned_by_key"] is False
    check_counts_stores(state_dir / "bf-counts", events, 3, 3)


def test_grouped_aggregations_in_the_bridges_session_skip_the_partial_step_but_its_own_does_not(spark: Any) -> None:
    """The bridge's session plans a grouped aggregation as one step after its shuffle (what
    a groupBy(key) into many keys gains from); the bridge's own aggregation over a whole
    history (each processor's last stream time, a global one) keeps its partial step.
    session_setting changes a setting for a block and puts back what was there."""
    import pyspark.sql.functions as F

    from streamkit.spark.session import BYPASS_PARTIAL_AGGREGATION, session_setting

    rows = spark.createDataFrame([(f"k{i}", i % 3) for i in range(60)], "key string, g int")

    def plan_of(df: Any) -> str:
        return str(df._jdf.queryExecution().executedPlan().toString())

    assert spark.conf.get(BYPASS_PARTIAL_AGGREGATION) == "true"
    assert "partial_max" not in plan_of(rows.groupBy("g").agg(F.max("key")))
    assert "partial_max" in plan_of(rows.agg(*[F.max(F.when(F.col("g") == q, F.col("key"))) for q in range(3)]))
    with session_setting(spark, BYPASS_PARTIAL_AGGREGATION, "false"):
        assert "partial_max" in plan_of(rows.groupBy("g").agg(F.max("key")))
        with session_setting(spark, "spark.streamkit.test.unset", "x"):  # nested in one thread: goes on
            assert spark.conf.get("spark.streamkit.test.unset") == "x"
        assert spark.conf.get("spark.streamkit.test.unset", None) is None  # unset again
    assert spark.conf.get(BYPASS_PARTIAL_AGGREGATION) == "true"


def test_state_backfill_for_a_scaled_out_job_and_user_positions(spark: Any, state_dir: Path) -> None:
    events = count_events(3000, 400, seed=2)
    df = state_df(spark, events).drop("offset", "partition")
    pos = next_positions(events)
    res = backfill_table(
        bf_apps.counts,
        "totals",
        df,
        BackfillOptions(positions=[f"events:{p}={o}" for (_, p), o in pos.items()], processors=5, state_dir=state_dir),
    )
    # without partition data, every store gets every position (and the result says so)
    check_counts_stores(state_dir / "bf-counts", events, 3, 5, everywhere=True)
    assert any("stamped into every store" in w for w in res.warnings)


def test_duplicate_keys_latest_offset_wins_and_null_means_no_state(spark: Any, state_dir: Path) -> None:
    rows = [
        ("a", '{"count":1,"sum":1}', 0, 5),
        ("a", '{"count":2,"sum":9}', 0, 9),  # latest of a
        ("b", '{"count":1,"sum":3}', 1, 4),
        ("b", None, 1, 7),  # b deleted last
        ("c", '{"count":1,"sum":4}', 1, 8),
    ]
    import pyspark.sql.functions as F

    df = spark.createDataFrame(rows, "key string, v string, partition int, offset long")
    df = df.withColumn("value", F.when(F.col("v").isNotNull(), F.col("v").cast("binary")))
    res = backfill_table(
        bf_apps.counts,
        "totals",
        df,
        BackfillOptions(value_encoded=True, offset_col="offset", partition_col="partition", state_dir=state_dir),
    )
    stores = read_all(state_dir / "bf-counts", ["totals"])
    merged = {k: v for tables, _ in stores.values() for k, v in tables["totals"].items()}
    assert merged == {b"a": b'{"count":2,"sum":9}', b"c": b'{"count":1,"sum":4}'}
    assert res.details["duplicates"] == 2 and res.details["null_values"] == 1
    assert res.positions == {("events", 0): 10, ("events", 1): 9}


def test_several_tables_in_one_backfill(spark: Any, state_dir: Path) -> None:
    from stores.serde import IntSerde

    sums = spark.createDataFrame([(k, k * 10) for k in range(-50, 300)], "key long, value long")
    last = spark.createDataFrame([(k, f"tag-{k}") for k in range(0, 300, 3)], "key long, value string")
    res = backfill_state(
        bf_apps.multi,
        {"sums": sums, "last": last},
        BackfillOptions(positions={("m-events", 0): 99}, processors=3, state_dir=state_dir),
    )
    assert res.keys_written == {"sums": 350, "last": 100}
    ints = IntSerde()
    got_sums, got_last = {}, {}
    for proc, (tables, cp) in read_all(state_dir / "bf-multi", ["sums", "last"]).items():
        assert cp.positions == {("m-events", 0): 99}
        for k, v in tables["sums"].items():
            assert processor_of(k, 2, 3) == proc
            got_sums[ints.loads(k)] = orjson.loads(v)
        for k, v in tables["last"].items():
            assert processor_of(k, 2, 3) == proc
            got_last[ints.loads(k)] = v.decode()  # str serde: the text itself
    assert got_sums == {k: k * 10 for k in range(-50, 300)}
    assert got_last == {k: f"tag-{k}" for k in range(0, 300, 3)}


def test_duplicate_keys_without_offsets_are_refused(spark: Any, state_dir: Path) -> None:
    df = spark.createDataFrame([("a", 1), ("a", 2)], "key string, value long")
    with pytest.raises(BackfillError, match="key b'a' appears more than once"):
        backfill_table(bf_apps.counts, "totals", df, BackfillOptions(positions={("events", 0): 3}, state_dir=state_dir))
    assert live_store_dirs(state_dir / "bf-counts") == {}


def test_refusals_before_any_work(spark: Any, state_dir: Path) -> None:
    df = spark.createDataFrame([("a", 1)], "key string, value long")
    with pytest.raises(ConfigError, match="windowed"):
        backfill_table(bf_apps.windowed, "per_minute", df, BackfillOptions(from_start=True, state_dir=state_dir))
    with pytest.raises(ConfigError, match=r"also has table\(s\) \['last'\]"):
        backfill_table(bf_apps.multi, "sums", df, BackfillOptions(from_start=True, state_dir=state_dir))
    with pytest.raises(ConfigError, match="no resume positions"):
        backfill_table(bf_apps.counts, "totals", df, BackfillOptions(state_dir=state_dir))
    with pytest.raises(ConfigError, match="no table 'nope'"):
        backfill_table(bf_apps.counts, "nope", df, BackfillOptions(from_start=True, state_dir=state_dir))
    with pytest.raises(ConfigError, match="key_col: no column 'k'"):
        backfill_table(bf_apps.counts, "totals", df, BackfillOptions(key_col="k", from_start=True, state_dir=state_dir))
    with pytest.raises(BackfillError, match="does not consume"):
        backfill_table(bf_apps.counts, "totals", df, BackfillOptions(positions={("typo", 0): 1}, state_dir=state_dir))
    ev = spark.createDataFrame([("a", 1, 0, 9)], "key string, value long, partition int, offset long")
    with pytest.raises(BackfillError, match="counted twice"):
        backfill_table(
            bf_apps.counts,
            "totals",
            ev,
            BackfillOptions(
                positions={("events", 0): 5}, offset_col="offset", partition_col="partition", state_dir=state_dir
            ),
        )
    assert live_store_dirs(state_dir / "bf-counts") == {}


def test_a_running_processor_blocks_the_backfill(spark: Any, state_dir: Path) -> None:
    events = count_events(500, 50, seed=3)
    df = state_df(spark, events)
    opts = BackfillOptions(offset_col="offset", partition_col="partition", state_dir=state_dir)
    backfill_table(bf_apps.counts, "totals", df, opts)
    before = read_all(state_dir / "bf-counts", ["totals"])
    held = RocksDBStore.open(str(state_dir / "bf-counts" / "processor-2"), ["totals"])
    try:
        with pytest.raises(BackfillRefused, match=rf"processor-2 is held by a running processor \(pid {os.getpid()}\)"):
            backfill_table(bf_apps.counts, "totals", df, opts)
    finally:
        held.close()
    assert read_all(state_dir / "bf-counts", ["totals"]) == before


@pytest.mark.parametrize("point", ["task", "after-spark", "build", "publish"])
def test_a_failure_at_any_point_leaves_the_live_stores_untouched(spark: Any, state_dir: Path, point: str) -> None:
    old = count_events(400, 60, seed=4)
    new = count_events(900, 80, seed=5)
    opts = BackfillOptions(offset_col="offset", partition_col="partition", state_dir=state_dir)
    backfill_table(bf_apps.counts, "totals", state_df(spark, old), opts)
    before = read_all(state_dir / "bf-counts", ["totals"])
    with pytest.raises((InjectedFailure, BackfillError)):
        backfill_table(bf_apps.counts, "totals", state_df(spark, new), opts, fail_at=point)  # a field over opts
    assert read_all(state_dir / "bf-counts", ["totals"]) == before
    assert sorted(os.listdir(state_dir / "bf-counts" / BACKFILL_DIR)) == ["lock"]


def test_task_retries_leave_no_partial_files(spark: Any, state_dir: Path) -> None:
    events = count_events(3000, 500, seed=6)
    # every first attempt of a writing task dies after a partial SST; the retry succeeds
    res = backfill_table(
        bf_apps.counts,
        "totals",
        state_df(spark, events),
        BackfillOptions(offset_col="offset", partition_col="partition", state_dir=state_dir, fail_at="task-once"),
    )
    check_counts_stores(state_dir / "bf-counts", events, 3, 3)
    assert res.keys_written["totals"] == len(final_state(events))
    leftovers = [str(p) for p in (state_dir / "bf-counts" / BACKFILL_DIR).rglob("*") if p.name != "lock"]
    assert leftovers == []
