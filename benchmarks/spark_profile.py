"""Where Spark's own time goes in the backfill benchmark's aggregation.

    python -m benchmarks.spark_profile                         # 50M events into 1M keys, 2 runs
    python -m benchmarks.spark_profile --events 5000000 --handover

It runs the DataFrame ``benchmarks.backfill`` hands the bridge (Spark's read of the events
and its ``groupBy(key)``) into Spark's ``noop`` sink, in the bridge's local session: the
bridge's part is nil, so what is printed is the floor of any Spark backfill of this
shape. For each run: wall seconds. For the last run:

- each stage from Spark's event log: tasks, CPU seconds summed over tasks, rows and bytes
  shuffled, Spark's "time in aggregation build";
- the JVM's hottest frames from a Java Flight Recorder profile of that run alone (the JDK's
  ``jfr`` tool reads it; without the tool this part is skipped, saying so): each sample
  put in one part of the job by the frames it runs in, and the top frames by self time.
  The recording (JFR's "default" settings, a sample every 20 ms) slows that run a little.

``--handover`` also times the same events handed to Python as Arrow batches that Python
only counts (``mapInArrow``): the floor of an aggregation moved out of Spark into Python.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.backfill import _aggregated  # noqa: E402 - after the sys.path line
from benchmarks.backfill_input import WARMUP_EVENTS, WARMUP_KEYS, cached_input  # noqa: E402

PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # (part of the job, the classes or packages whose frames put a sample in it; a class's
    # nested classes count as its own)
    ("hash aggregation: the map (lookups, inserts)", ("org.apache.spark.unsafe.map.BytesToBytesMap",)),
    (
        "shuffle write",
        (
            "org.apache.spark.shuffle.sort.",
            "org.apache.spark.storage.DiskBlockObjectWriter",
            "org.apache.spark.storage.TimeTrackingOutputStream",
            "org.apache.spark.sql.execution.UnsafeRowSerializerInstance$$anon$1",  # the serialising stream
        ),
    ),
    (
        "shuffle read",
        (
            "org.apache.spark.sql.execution.UnsafeRowSerializerInstance$$anon$2",  # the deserialising stream
            "org.apache.spark.storage.ShuffleBlockFetcherIterator",
            "org.apache.spark.shuffle.BlockStoreShuffleReader",
        ),
    ),
    ("Parquet scan", ("org.apache.parquet.", "org.apache.spark.sql.execution.datasources.parquet.")),
    ("hash aggregation: the rest", ("org.apache.spark.sql.execution.UnsafeFixedWidthAggregationMap",)),
    ("shuffle checksums", ("org.apache.spark.shuffle.checksum.", "org.apache.spark.sql.catalyst.expressions.XXH64")),
    ("hashing keys (the partitioner's, the map's)", ("org.apache.spark.unsafe.hash.",)),
)


# --------------------------------------------------------------------------- reading the records


def stage_summaries(event_lines: Iterable[str], job_group: str) -> list[dict[str, Any]]:
    """Per stage of the jobs run under ``job_group`` (Spark's event log, one JSON event a
    line): tasks, CPU seconds, shuffle records and bytes, aggregation build seconds."""
    stages_of_group: set[int] = set()
    totals: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in event_lines:
        if not line.strip():
            continue
        event = json.loads(line)
        kind = event.get("Event")
        if kind == "SparkListenerJobStart":
            if (event.get("Properties") or {}).get("spark.jobGroup.id") == job_group:
                stages_of_group.update(event.get("Stage IDs", []))
        elif kind == "SparkListenerTaskEnd":
            metrics = event.get("Task Metrics") or {}
            stage = totals[event["Stage ID"]]
            stage["tasks"] += 1
            stage["cpu_ns"] += metrics.get("Executor CPU Time", 0)
            stage["gc_ms"] += metrics.get("JVM GC Time", 0)
            written = metrics.get("Shuffle Write Metrics") or {}
            stage["shuffle_rows_written"] += written.get("Shuffle Records Written", 0)
            stage["shuffle_bytes_written"] += written.get("Shuffle Bytes Written", 0)
            read = metrics.get("Shuffle Read Metrics") or {}
            stage["shuffle_rows_read"] += read.get("Total Records Read", 0)
            for acc in (event.get("Task Info") or {}).get("Accumulables", []):
                if acc.get("Name") == "time in aggregation build":
                    stage["agg_build_ms"] += int(acc.get("Update") or 0)
    return [
        {
            "stage": sid,
            "tasks": c["tasks"],
            "cpu_s": c["cpu_ns"] / 1e9,
            "gc_s": c["gc_ms"] / 1e3,
            "shuffle_rows_written": c["shuffle_rows_written"],
            "shuffle_bytes_written": c["shuffle_bytes_written"],
            "shuffle_rows_read": c["shuffle_rows_read"],
            "agg_build_s": c["agg_build_ms"] / 1e3,
        }
        for sid, c in sorted(totals.items())
        if sid in stages_of_group and c["tasks"]
    ]


def sample_stacks(jfr_json: Mapping[str, Any]) -> Iterator[list[str]]:
    """Each execution sample's frames, innermost first, as ``package.Class.method``
    (``jfr print --json --events jdk.ExecutionSample``)."""
    for event in jfr_json.get("recording", {}).get("events", []):
        frames = ((event.get("values") or {}).get("stackTrace") or {}).get("frames") or []
        stack = [f"{f['method']['type']['name'].replace('/', '.')}.{f['method']['name']}" for f in frames]
        if stack:
            yield stack


def profile_summary(
    stacks: Iterable[list[str]], parts: tuple[tuple[str, tuple[str, ...]], ...] = PARTS, top: int = 12
) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]]:
    """(samples, share of each part of the job, the top frames by self time). A sample goes
    to the part of its innermost frame that is some part's (a Parquet read under the
    shuffle writer that pulls its rows is the scan's), else to "other"."""
    by_part: collections.Counter[str] = collections.Counter()
    by_self: collections.Counter[str] = collections.Counter()
    n = 0
    for stack in stacks:
        n += 1
        by_self[stack[0]] += 1
        part = next((name for f in stack for name, marks in parts if f.startswith(marks)), "other")
        by_part[part] += 1
    if not n:
        return 0, [], []
    order = [name for name, _ in parts] + ["other"]
    shares = [(name, by_part[name] / n) for name in order if by_part[name]]
    return n, shares, [(f, c / n) for f, c in by_self.most_common(top)]


# --------------------------------------------------------------------------- running


def _jfr_tool() -> str | None:
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home) / "bin" / "jfr" if home else None
    if candidate is not None and candidate.exists():
        return str(candidate)
    return shutil.which("jfr")


def _timed_noop(df: Any) -> float:
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t0


def _count_batches(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    rows = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pydict({"rows": [rows]})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=50_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--handover", action="store_true", help="also time the events handed to Python (mapInArrow)")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "streamkit-bench-backfill")
    ap.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    if bad := [item for item in args.spark_conf if "=" not in item]:
        ap.error(f"--spark-conf takes KEY=VALUE, not {bad[0]!r}")
    parquet = cached_input(args.workdir, args.events, args.keys)
    small = cached_input(args.workdir, WARMUP_EVENTS, WARMUP_KEYS)

    logs = Path(tempfile.mkdtemp(prefix="spark-profile-"))
    try:
        recorded = _measure(args, parquet, small, logs)
        _report(args, logs, recorded)
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def _measure(args: argparse.Namespace, parquet: Path, small: Path, logs: Path) -> Path | None:
    """The runs, Spark's event log written under ``logs``; the last run's recording, if any."""
    from streamkit.spark.session import local_session

    conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(logs), "spark.eventLog.compress": "false"}
    conf.update(item.split("=", 1) for item in args.spark_conf)
    spark = local_session(args.cores, shuffle_partitions=args.cores * 2, conf=conf)
    sc = spark.sparkContext
    for _ in range(2):  # warm-up: workers, code generation, JIT
        _timed_noop(_aggregated(spark, small))
    recording = None
    for run in range(1, args.runs + 1):
        if run == args.runs and _jfr_tool():
            jvm = sc._jvm
            recording = jvm.jdk.jfr.Recording(jvm.jdk.jfr.Configuration.getConfiguration("default"))
            recording.start()
        sc.setJobGroup(f"run-{run}", f"aggregation run {run}")
        secs = _timed_noop(_aggregated(spark, parquet))
        print(f"Spark's read + groupBy of {args.events:,} events, run {run}: {secs:.2f}s", flush=True)
    recorded = None
    if recording is not None:
        recording.stop()
        recorded = logs / "last-run.jfr"
        recording.dump(sc._jvm.java.io.File(str(recorded)).toPath())
        recording.close()
    if args.handover:
        sc.setJobGroup("handover", "handed to Python")
        df = spark.read.parquet(str(parquet)).mapInArrow(_count_batches, "rows long")
        print(f"the same events handed to Python as Arrow batches, counted: {_timed_noop(df):.2f}s", flush=True)
    spark.stop()
    return recorded


def _report(args: argparse.Namespace, logs: Path, recorded: Path | None) -> None:
    lines = (line for path in sorted(logs.rglob("events_*")) if path.is_file() for line in path.open())
    stages = stage_summaries(lines, f"run-{args.runs}")
    print(f"\nstages of run {args.runs} (Spark's event log; CPU summed over tasks on {args.cores} cores):")
    if not stages:
        print(f"  none found: no events_* file of Spark's event log under {logs} holds that run's stages")
    for s in stages:
        print(
            f"  stage {s['stage']}: {s['tasks']} tasks, CPU {s['cpu_s']:.2f}s (GC {s['gc_s']:.2f}s), shuffle rows "
            f"written {s['shuffle_rows_written']:,} ({s['shuffle_bytes_written'] / 1e6:,.0f} MB), read "
            f"{s['shuffle_rows_read']:,}; time in aggregation build {s['agg_build_s']:.2f}s"
        )
    jfr = _jfr_tool()
    if recorded is None or jfr is None:
        print("no profile: the JDK's jfr tool was not found (JAVA_HOME/bin/jfr or on PATH)")
        return
    printed = subprocess.run(
        [jfr, "print", "--json", "--stack-depth", "64", "--events", "jdk.ExecutionSample", str(recorded)],
        capture_output=True,
        text=True,
    )
    if printed.returncode != 0:
        print(f"no profile: jfr print failed: {printed.stderr.strip()}")
        return
    n, shares, top = profile_summary(sample_stacks(json.loads(printed.stdout)))
    print(f"\nJava Flight Recorder, run {args.runs}: {n:,} samples (64 frames deep at most)")
    for name, share in shares:
        print(f"  {share:6.1%}  {name}")
    print("  top frames by self time:")
    for frame, share in top:
        print(f"  {share:6.1%}  {frame}")


if __name__ == "__main__":
    main()
