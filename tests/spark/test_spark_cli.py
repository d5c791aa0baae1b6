"""`streamkit backfill` from Parquet files (in-process, sharing the suite's SparkSession)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from conftest import seed_topic
from test_spark_backfill import PARTS, count_events, final_state, next_positions, read_all
from typer.testing import CliRunner

from streamkit.cli import app as cli
from streamkit.spark.inputs import parse_source
from streamkit.spark.placement import processor_of
from streamkit.spark.staging import live_store_dirs


def write_events(path: Path, events: list[tuple[str, int, int, int, int]]) -> None:
    pq.write_table(
        pa.table(
            {
                "key": [e[0] for e in events],
                "amount": [e[1] for e in events],
                "partition": [e[2] for e in events],
                "offset": [e[3] for e in events],
                "ts": [e[4] for e in events],
            }
        ),
        path,
    )


def run(args: list[str]) -> Any:
    result = CliRunner().invoke(cli, args, catch_exceptions=True)
    return result


def test_parse_source_forms(tmp_path: Path) -> None:
    assert parse_source("parquet:/data/x") == ("parquet", "/data/x")
    assert parse_source("table:db.events") == ("table", "db.events")
    assert parse_source("/a/b.csv") == ("csv", "/a/b.csv")
    assert parse_source("/a/b.jsonl") == ("json", "/a/b.jsonl")
    d = tmp_path / "lake"
    d.mkdir()
    (d / "part-0.orc").write_bytes(b"")
    assert parse_source(str(d)) == ("orc", str(d))
    assert parse_source(str(tmp_path / "nothing")) == ("parquet", str(tmp_path / "nothing"))


def test_cli_backfills_both_modes_and_prints_a_summary(
    spark: Any, state_dir: Path, tmp_path: Path, fresh_broker: str
) -> None:
    events = count_events(4000, 500, seed=11)
    history = tmp_path / "events.parquet"
    write_events(history, events)
    seed_topic(fresh_broker, "events", PARTS, events)
    # mode 1: a final-state table computed beforehand (as a lake job would), as Parquet
    import pyspark.sql.functions as F

    state = tmp_path / "state.parquet"
    (
        spark.read.parquet(str(history))
        .groupBy("key")
        .agg(
            F.count("*").alias("count"),
            F.sum("amount").alias("sum"),
            F.max("offset").alias("offset"),
            F.first("partition").alias("partition"),
        )
        .write.parquet(str(state))
    )
    res = run(
        [
            "backfill",
            "bf_apps:counts",
            "--table",
            "totals",
            "--from",
            f"parquet:{state}",
            "--value-col",
            "count,sum",
            "--offset-col",
            "offset",
            "--partition-col",
            "partition",
            "--state-dir",
            str(state_dir),
            "--broker",
            fresh_broker,
            "--json",
        ]
    )
    assert res.exit_code == 0, res.output + repr(res.exception)
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["rows_read"] == len(final_state(events)) == doc["keys_written"]["totals"]
    assert doc["stores_published"] == 3
    assert {(t, p): o for t, p, o in doc["positions"]} == next_positions(events)
    assert {"jvm", "spark", "build", "publish"} <= set(doc["timings"])
    first = read_all(state_dir / "bf-counts", ["totals"])
    merged = {k.decode(): orjson.loads(v) for tables, _ in first.values() for k, v in tables["totals"].items()}
    assert merged == final_state(events)

    # mode 2 from the raw events, with the human summary
    res = run(
        [
            "backfill",
            "bf_apps:counts",
            "--replay",
            "--from",
            str(history),
            "--value-col",
            "amount,",
            "--partition-col",
            "partition",
            "--offset-col",
            "offset",
            "--timestamp-col",
            "ts",
            "--state-dir",
            str(state_dir),
            "--broker",
            fresh_broker,
            "--no-progress",
        ]
    )
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "rows read" in res.stdout and f"{len(events):,}" in res.stdout
    assert "stores published" in res.stdout and "JVM start" in res.stdout
    second = read_all(state_dir / "bf-counts", ["totals"])
    assert {p: (t, cp.positions) for p, (t, cp) in second.items()} == {
        p: (t, cp.positions) for p, (t, cp) in first.items()
    }  # the same state and positions either way (the checkpoints' extra names the mode)
    for proc, (tables, _) in first.items():
        assert all(processor_of(k, 3, 3) == proc for k in tables["totals"])


def test_cli_errors_are_one_line(spark: Any, state_dir: Path, tmp_path: Path, fresh_broker: str) -> None:
    res = run(["backfill", "bf_apps:counts", "--table", "totals"])
    assert res.exit_code != 0 and "--from" in str(res.exception)
    res = run(
        [
            "backfill",
            "bf_apps:counts",
            "--table",
            "totals",
            "--from",
            str(tmp_path / "missing.parquet"),
            "--from-start",
            "--state-dir",
            str(state_dir),
            "--broker",
            fresh_broker,
        ]
    )
    assert res.exit_code != 0 and "no such file" in str(res.exception)
    events = count_events(200, 20, seed=12)
    history = tmp_path / "e.parquet"
    write_events(history, events)
    res = run(
        [
            "backfill",
            "bf_apps:counts",
            "--table",
            "totals",
            "--from",
            str(history),
            "--value-col",
            "amount",
            "--state-dir",
            str(state_dir),
            "--broker",
            fresh_broker,
        ]
    )
    assert res.exit_code != 0 and "no resume positions" in str(res.exception)
    assert "-p TOPIC:PARTITION=NEXT_OFFSET" in str(res.exception) and "--from-start" in str(res.exception)
    assert live_store_dirs(state_dir / "bf-counts") == {}
    # the installed console script prints errors as one line
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "streamkit.cli", "backfill", "bf_apps:nope", "--table", "x", "--from", "y"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
    )
    assert proc.returncode == 1 and proc.stderr.strip().startswith("error:")
    assert len(proc.stderr.strip().splitlines()) == 1
