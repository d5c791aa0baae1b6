"""What a table fed by a topic refuses, and how its versions read (no broker needed)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import streamkit
from stores.serde import serde_for
from streamkit.errors import ConfigError
from streamkit.joins.fed_table import FedTable, VersionsSerde
from streamkit.testing import TestDriver
from streamkit.windows import LateRecordError


class Backend(dict[Any, Any]):
    def items(self) -> Any:  # type: ignore[override]
        return iter(list(super().items()))


def _bound(history: float = 10.0) -> tuple[FedTable, SimpleNamespace]:
    app = streamkit.App("fed-decl")
    table = app.table("customers", source="customers", history=history)
    assert isinstance(table, FedTable)
    clock = SimpleNamespace(timestamp=-1)
    table.bind(Backend(), clock)
    return table, clock


def _feed(table: FedTable, key: str, value: Any, ts: int) -> None:
    table.feed(key, value, SimpleNamespace(timestamp=ts))


def test_reads_are_as_of_the_records_time_and_a_tombstone_deletes_from_its_time() -> None:
    table, clock = _bound()
    for ts, value in [(100, {"v": 1}), (300, {"v": 3}), (200, {"v": 2}), (400, None)]:  # 200 late
        _feed(table, "c", value, ts)
    seen = {}
    for at in (50, 100, 150, 250, 300, 399, 400, 500):
        clock.timestamp = at
        seen[at] = table.get("c")
    assert seen == {50: None, 100: {"v": 1}, 150: {"v": 1}, 250: {"v": 2}, 300: {"v": 3}, 399: {"v": 3},
                    400: None, 500: None}  # fmt: skip
    clock.timestamp = 350
    assert table["c"] == {"v": 3} and "c" in table
    clock.timestamp = 450
    assert "c" not in table and list(table.items()) == []
    with pytest.raises(KeyError):
        table["c"]
    clock.timestamp = -1  # no record (a timer): the latest
    assert table.get("c", "gone") == "gone"


def test_a_later_record_of_the_same_time_replaces_the_version() -> None:
    table, clock = _bound()
    _feed(table, "c", {"v": 1}, 100)
    _feed(table, "c", {"v": 2}, 100)
    assert table.versions("c") == [(100, {"v": 2})]
    clock.timestamp = 100
    assert table.get("c") == {"v": 2}


def test_versions_older_than_the_history_go_but_the_last_of_them() -> None:
    table, clock = _bound(history=10.0)  # 10,000 ms
    for ts in (0, 1_000, 2_000, 15_000, 30_000):
        _feed(table, "c", {"at": ts}, ts)
    assert [ts for ts, _ in table.versions("c")] == [15_000, 30_000]  # 20,000 and later, and 15,000 before
    clock.timestamp = 16_000
    assert table.get("c") == {"at": 15_000}


def test_a_record_older_than_the_kept_versions_is_late_not_dropped_without_a_word() -> None:
    table, _ = _bound(history=10.0)
    for ts in (5_000, 20_000):
        _feed(table, "c", {"at": ts}, ts)  # 5,000: the last version before 10,000, kept
    with pytest.raises(LateRecordError, match=r"table 'customers': .* for key 'c' at 1000 ms is older") as late:
        _feed(table, "c", {"at": 1_000}, 1_000)
    assert (late.value.table, late.value.start) == ("customers", 1_000)
    _feed(table, "c", None, 5_000)  # the kept one's own time: it replaces it
    _feed(table, "c", {"at": 8_000}, 8_000)  # newer than the kept one: kept in its place
    assert [ts for ts, _ in table.versions("c")] == [8_000, 20_000]


def test_a_late_source_record_is_a_dead_letter_and_the_table_stays_as_it_was() -> None:
    app = streamkit.App("fed-late")
    customers = app.table("customers", source="customers", history=10.0)
    seen: list[int] = []

    @app.processor("customers")
    def mine(key: Any, value: Any, ctx: Any) -> None:
        seen.append(ctx.timestamp)

    with TestDriver(app) as driver:
        for at in (5, 20):
            driver.send("customers", "c", {"at": at}, timestamp=at)
        driver.send("customers", "c", {"at": 1}, timestamp=1)  # before the kept 5 s: no lookup could see it
        [dead] = driver.dead_letters()
        assert (dead.reason, dead.topic, dead.offset, dead.handler) == ("late", "customers", 2, "FedTable.feed")
        assert "table 'customers'" in dead.error and "key 'c' at 1000 ms" in dead.error
        assert driver.table("customers") == {"c": [(5_000, {"at": 5}), (20_000, {"at": 20})]}
        assert seen == [5_000, 20_000, 1_000]  # the app's own handlers of the topic still run
    assert isinstance(customers, FedTable)


def test_the_versions_serde_round_trips_tombstones_and_any_inner_serde() -> None:
    for inner, value in ((serde_for("json"), {"a": [1, 2]}), (serde_for("raw"), b"\x00\xff"), (serde_for("str"), "é")):
        serde = VersionsSerde(inner)
        versions = [(1, value), (2, None), (-5, value)]
        assert serde.loads(serde.dumps(versions)) == versions


def test_handlers_cannot_write_it_and_a_concurrent_source_is_refused() -> None:
    table, _ = _bound()
    with pytest.raises(TypeError, match="fed by topic 'customers'"):
        table["c"] = 1
    with pytest.raises(TypeError, match="fed by topic"):
        del table["c"]
    with pytest.raises(ValueError, match="without a key"):
        _feed(table, None, {"v": 1}, 1)  # type: ignore[arg-type]
    app = streamkit.App("fed-decl")
    app.table("customers", source="customers")
    with pytest.raises(ValueError, match="feeds table 'customers'"):

        @app.processor("customers", concurrency=4)
        async def handle(key: Any, value: Any, ctx: Any) -> None: ...

    app = streamkit.App("fed-decl")

    @app.processor("customers", concurrency=4)
    async def handle2(key: Any, value: Any, ctx: Any) -> None: ...

    with pytest.raises(ValueError, match="concurrency=4"):
        app.table("customers", source="customers")
    with pytest.raises(ValueError, match="neither window= nor default="):
        streamkit.App("x").table("t", source="s", default=int)
    with pytest.raises(ValueError, match="history= is for a table fed"):
        streamkit.App("x").table("t", history=5)
    for history in (float("nan"), float("inf"), 0.0004, 0):  # versions are kept by the ms
        with pytest.raises(ValueError, match=r"table 't': history must be a finite number of seconds >= 0\.001"):
            streamkit.App("x").table("t", source="s", history=history)


def test_the_feed_runs_before_the_apps_own_handlers_of_its_topic() -> None:
    app = streamkit.App("fed-decl")

    @app.processor("customers")
    def mine(key: Any, value: Any, ctx: Any) -> None: ...

    table = app.table("customers", source="customers")
    assert [spec.fn for spec in app.handlers["customers"]] == [table.feed, mine]


def test_the_spark_replay_refuses_an_app_with_a_fed_table() -> None:
    from streamkit.spark.replay_mode import backfill_replay

    app = streamkit.App("fed-decl")
    orders = app.topic("orders")
    app.table("customers", source="customers")
    totals = app.table("totals", default=int)

    @app.processor(orders)
    def count(key: Any, value: Any, ctx: Any) -> None:
        totals[key] += 1

    with pytest.raises(ConfigError, match="tables fed by topics \\(customers\\).*topic_col="):
        backfill_replay(app, "unused.parquet", topic="orders", allow_partial=True)
    # the history of all inputs (tests/spark/test_spark_merged_replay.py runs one) needs their times
    with pytest.raises(ConfigError, match="merging their histories in time order needs .*timestamp_col"):
        backfill_replay(app, "unused.parquet", topic_col="topic")
    with pytest.raises(ConfigError, match="give topic .* or topic_col"):
        backfill_replay(app, "unused.parquet", topic="orders", topic_col="topic", timestamp_col="ts")


def test_a_worker_refuses_at_start_a_fed_table_whose_keys_another_input_encodes_otherwise() -> None:
    import asyncio

    from streamkit.runtime.worker import Worker

    app = streamkit.App("fed-decl", broker="127.0.0.1:1")
    orders = app.topic("orders", key_serde="int")
    app.table("customers", source=app.topic("customers", key_serde="str"))

    @app.processor(orders)
    def join(key: Any, value: Any, ctx: Any) -> None: ...

    with pytest.raises(ConfigError, match="fed by topic 'customers' .* reads topic 'orders'.*same key_serde"):
        asyncio.run(Worker(app, 1).prepare())


def test_the_spark_replay_refuses_an_app_with_a_stream_join() -> None:
    from streamkit.spark.replay_mode import backfill_replay

    app = streamkit.App("join-decl")

    @app.join("views", "clicks", within=5)
    def pair(key: Any, view: Any, click: Any, ctx: Any) -> None: ...

    with pytest.raises(ConfigError, match="stream joins \\(pair\\)"):
        backfill_replay(app, "unused.parquet", topic="views", allow_partial=True)


def test_join_declarations_refuse_what_cannot_be_served() -> None:
    app = streamkit.App("join-decl")
    with pytest.raises(ValueError, match="encode keys differently"):
        app.join(app.topic("a", key_serde="int"), app.topic("b"), within=5)(lambda k, lv, rv, c: None)
    for within in (0, 0.0004, float("nan"), float("inf")):  # its buckets are whole ms
        with pytest.raises(ValueError, match="within must be at least 0.001 seconds"):
            app.join("a2", "b2", within=within)(lambda k, lv, rv, c: None)
    with pytest.raises(ValueError, match="grace must be >= 0"):
        app.join("a2", "b2", within=1, grace=float("nan"))(lambda k, lv, rv, c: None)
    with pytest.raises(ValueError, match="how must be"):
        app.join("a2", "b2", within=1, how="cross")(lambda k, lv, rv, c: None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="plain function"):

        @app.join("a2", "b2", within=1)
        async def pair(key: Any, view: Any, click: Any, ctx: Any) -> None: ...


def test_the_buffer_serde_round_trips_both_sides_and_empty_values() -> None:
    from streamkit.joins.stream_join import BufferSerde

    serde = BufferSerde(serde_for("json"), serde_for("raw"))
    for bucket in ([[], []], [[[5, True, {"a": 1}], [6, False, None]], [[7, False, b"\x00"]]], [[], [[1, True, b""]]]):
        assert serde.loads(serde.dumps(bucket)) == bucket  # type: ignore[arg-type]


def test_the_spark_replay_of_an_app_with_a_global_table_needs_the_broker(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from streamkit.spark.replay_mode import backfill_replay

    app = streamkit.App("global-decl", processors=2)
    products = app.global_table("products", source="products")
    totals = app.table("totals", default=int)

    @app.processor("orders")
    def count(key: Any, value: Any, ctx: Any) -> None:
        totals[key] += products.get(value)

    history = tmp_path / "history.parquet"
    pq.write_table(pa.table({"key": ["a"], "value": ["p1"], "offset": [0], "partition": [0]}), history)
    with pytest.raises(ConfigError, match="reads global tables \\(products\\), which the replay reads .* broker="):
        backfill_replay(app, str(history), offset_col="offset", partition_col="partition", from_start=True,
                        state_dir=tmp_path / "state")  # fmt: skip
