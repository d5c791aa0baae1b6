"""Mistakes a backfill user can make, each refused before Spark starts (the command runs
with a Java that cannot start: any JVM start would fail with another message), with
one line naming CLI flags, and the live stores untouched; keyless rows and rows a
handler rejects are counted, sampled and fail the run unless --allow-skipped."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from examples.purchases import _write
from stores.base import Checkpoint
from stores.rocksdb import RocksDBStore
from streamkit.cli import app as cli
from streamkit.cli.backfill import cli_message

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(fresh_broker: str, tmp_path: Path) -> dict[str, Any]:
    """``purchases`` (4 partitions, a streamkit layout) holding 2,000 purchases, the whole
    of them exported to Parquet, and a live store of processor 0 to stay untouched."""
    env = {**os.environ, "STREAMKIT_BROKER": fresh_broker, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-m", "streamkit.cli", "topics", "create", "purchases", "--partitions", "4"],
        env=env,
        check=True,
        capture_output=True,
    )
    rows = asyncio.run(_write(fresh_broker, 2_000, 300, 2_000, seed=3))
    history = tmp_path / "history.parquet"
    pq.write_table(pa.Table.from_pylist(rows), history)
    ends: dict[int, int] = {}
    for r in rows:
        ends[r["partition"]] = max(ends.get(r["partition"], 0), r["offset"] + 1)
    state = tmp_path / "state"
    store = RocksDBStore.open(str(state / "purchases" / "processor-0"), ["spent"])
    store.commit({"spent": {b"customer-x": b'{"purchases":1}'}}, Checkpoint(positions={("purchases", 0): 1}))
    store.close()
    return {"broker": fresh_broker, "history": history, "ends": ends, "state": state, "env": env}


def tree_digest(state: Path) -> dict[str, Any]:
    """What the app's stores hold (state and checkpoint), and which directories exist."""
    app_dir = state / "purchases"
    staging = ("backfill-logs", ".backfill")
    out: dict[str, Any] = {"entries": sorted(p.name for p in app_dir.iterdir() if p.name not in staging)}
    for path in sorted(app_dir.glob("processor-*")):
        store = RocksDBStore.open(str(path), ["spent"], create=False)
        try:
            out[path.name] = (dict(store.items("spent")), store.checkpoint().positions)
        finally:
            store.close()
    return out


def backfill_without_java(c: dict[str, Any], *args: str) -> str:
    """Run ``streamkit backfill`` with a Java that cannot start; returns its one error line."""
    cmd = [sys.executable, "-m", "streamkit.cli", "backfill", "examples.purchases:app", "--state-dir", str(c["state"])]
    proc = subprocess.run(
        [*cmd, *args],
        env={**c["env"], "JAVA_HOME": "/nonexistent-java", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert "Spark's output" not in lines[0] and "Java" not in lines[0]  # refused before Spark started
    return lines[0]


REPLAY = ("--replay", "--key-col", "customer", "--value-col", "amount,", "--order-by", "offset")


def test_mistakes_are_refused_before_spark_starts_and_stores_stay_untouched(cluster: dict[str, Any]) -> None:
    c = cluster
    before = tree_digest(c["state"])
    history = str(c["history"])
    ends = c["ends"]

    # a position for one partition of four: the three others are named (no double count possible)
    err = backfill_without_java(c, *REPLAY, "--from", history, "-p", f"purchases:0={ends[0]}")
    assert "no position for 3 partition(s)" in err
    for p in (1, 2, 3):
        assert f"purchases:{p} (high watermark {ends[p]})" in err
    assert "-p TOPIC:PARTITION=NEXT_OFFSET" in err and "--from-start" in err and "from_start" not in err

    # a position beyond the partition's end
    everything = [a for p in range(4) for a in ("-p", f"purchases:{p}={ends[p]}")]
    err = backfill_without_java(c, *REPLAY, "--from", history, *everything[:-1], "purchases:3=999999")
    assert f"purchases:3=999999 is beyond the partition's end (high watermark {ends[3]})" in err

    # a partition that does not exist
    err = backfill_without_java(c, *REPLAY, "--from", history, *everything, "-p", "purchases:9=100")
    assert "purchases has no partition 9 (it has 0..3)" in err

    # a column that is not there (read from the Parquet footer), named by its flag
    err = backfill_without_java(
        c, "--replay", "--key-col", "customer", "--value-col", "amont,", "--order-by", "offset", "--from", history
    )
    assert "--value-col: no column 'amont'" in err and "did you mean 'amount'?" in err

    # positions and --from-start at once
    err = backfill_without_java(c, *REPLAY, "--from", history, "--from-start", *everything[:2])
    assert "--from-start says none of the history is in Kafka" in err

    # a running worker holds a store (the store lock a processor takes)
    held = RocksDBStore.open(str(c["state"] / "purchases" / "processor-0"), ["spent"], create=False)
    try:
        err = backfill_without_java(c, *REPLAY, "--from", history, *everything)
        assert "is held by a running processor" in err and "stop the app's workers" in err
    finally:
        held.close()

    assert tree_digest(c["state"]) == before


def with_nulls(source: Path, target: Path, column: str, rows: tuple[int, ...]) -> int:
    table = pq.read_table(source)
    values = table.column(column).to_pylist()
    for i in rows:
        values[i] = None
    index = table.schema.get_field_index(column)
    pq.write_table(table.set_column(index, column, pa.array(values, table.schema.field(column).type)), target)
    return table.num_rows


def test_rows_left_out_fail_the_run_unless_allowed_and_are_reported(
    spark: Any, cluster: dict[str, Any], tmp_path: Path
) -> None:
    c = cluster
    keyless, rejected = tmp_path / "keyless.parquet", tmp_path / "rejected.parquet"
    n = with_nulls(c["history"], keyless, "customer", (5, 700, 1500))
    with_nulls(keyless, keyless, "amount", (900,))  # the handler adds None: TypeError
    with_nulls(c["history"], rejected, "amount", (900,))
    before = tree_digest(c["state"])

    def backfill(history: Path, *extra: str) -> Any:
        args = ["backfill", "examples.purchases:app", *REPLAY, "--from", str(history), "--state-dir", str(c["state"])]
        args += ["--partition-col", "partition", "--offset-col", "offset", "--broker", c["broker"], "--no-progress"]
        return CliRunner().invoke(cli, [*args, *extra])

    res = backfill(keyless)  # refused after the Spark job (its tasks count them), with a count and samples
    message = str(res.exception)
    assert res.exit_code != 0 and f"3 of {n:,} rows have no key" in message and "'amount':" in message
    assert "--allow-skipped" in message
    res = backfill(rejected)  # refused after the Spark job, before anything is published
    message = str(res.exception)
    assert res.exit_code != 0 and "1 history row(s) were rejected by a handler" in message, message
    assert "TypeError" in message and "--allow-skipped" in message
    assert tree_digest(c["state"]) == before

    res = backfill(keyless, "--allow-skipped", "--json")  # accepted: left out, counted and said
    assert res.exit_code == 0, res.output + repr(res.exception)
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["rows_read"] == n
    assert doc["details"]["left_out"] == {"rows without a key": 3, "rejected by a handler": 1}
    assert tree_digest(c["state"]) != before


def test_cli_messages_name_flags() -> None:
    assert cli_message("or from_start=True if none") == "or --from-start if none"
    assert cli_message("offset_col needs partition_col") == "--offset-col needs --partition-col"
    assert cli_message("this backfill uses p0=3: a backfill") == "this backfill uses --p0 3: a backfill"
    assert cli_message("pass p0= with the count") == "pass --p0 with the count"
    assert cli_message("topic 'events'") == "topic 'events'"
    assert cli_message("not partitioned by key (pass partitioned_by_key=False)") == (
        "not partitioned by key (pass --shuffle)"
    )


def test_local_session_registers_the_streamkit_source(spark: Any, tmp_path: Path) -> None:
    from streamkit.spark.session import local_session

    assert local_session() is spark
    store = RocksDBStore.open(str(tmp_path / "app" / "processor-0"), ["spent"])
    store.commit({"spent": {b"k": b"1"}}, Checkpoint(positions={}))
    store.close()
    df = spark.read.format("streamkit").option("path", str(tmp_path / "app")).option("table", "spent").load()
    assert [(r["key"], r["value"]) for r in df.collect()] == [(b"k", b"1")]
