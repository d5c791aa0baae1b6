"""The Spark profile's reading of Spark's event log and of a Flight Recorder profile (pure logic)."""

from __future__ import annotations

import json

from benchmarks.spark_profile import profile_summary, sample_stacks, stage_summaries


def _task_end(stage: int, cpu_ns: int, written: int = 0, read: int = 0, build_ms: int = 0) -> str:
    accumulables = [{"Name": "time in aggregation build", "Update": str(build_ms)}] if build_ms else []
    accumulables.append({"Name": "number of output rows", "Update": "7"})
    return json.dumps(
        {
            "Event": "SparkListenerTaskEnd",
            "Stage ID": stage,
            "Task Info": {"Accumulables": accumulables},
            "Task Metrics": {
                "Executor CPU Time": cpu_ns,
                "JVM GC Time": 10,
                "Shuffle Write Metrics": {"Shuffle Records Written": written, "Shuffle Bytes Written": written * 20},
                "Shuffle Read Metrics": {"Total Records Read": read},
            },
        }
    )


def _job_start(group: str, stages: list[int]) -> str:
    return json.dumps(
        {"Event": "SparkListenerJobStart", "Stage IDs": stages, "Properties": {"spark.jobGroup.id": group}}
    )


def test_stages_are_those_of_the_run_asked_for_with_their_tasks_summed() -> None:
    lines = [
        _job_start("run-1", [0, 1]),
        _task_end(0, 5_000_000_000, written=100),
        _task_end(1, 1_000_000_000, read=100, build_ms=900),
        _job_start("run-2", [2, 3]),
        _task_end(2, 2_000_000_000, written=60),
        _task_end(2, 3_000_000_000, written=40),
        _task_end(3, 4_000_000_000, read=100, build_ms=3_500),
        "",  # a blank line ends Spark's log files
        _job_start("other", [4]),
        _task_end(4, 9_000_000_000),
    ]
    assert stage_summaries(lines, "run-2") == [
        {
            "stage": 2,
            "tasks": 2,
            "cpu_s": 5.0,
            "gc_s": 0.02,
            "shuffle_rows_written": 100,
            "shuffle_bytes_written": 2_000,
            "shuffle_rows_read": 0,
            "agg_build_s": 0.0,
        },
        {
            "stage": 3,
            "tasks": 1,
            "cpu_s": 4.0,
            "gc_s": 0.01,
            "shuffle_rows_written": 0,
            "shuffle_bytes_written": 0,
            "shuffle_rows_read": 100,
            "agg_build_s": 3.5,
        },
    ]


def _frame(cls: str, method: str) -> dict:
    return {"method": {"type": {"name": cls.replace(".", "/")}, "name": method}}


def test_each_sample_goes_to_the_part_of_its_innermost_known_frame_and_self_time_is_the_innermost_frame() -> None:
    lookup = [
        _frame("org.apache.spark.unsafe.array.ByteArrayMethods", "arrayEquals"),
        _frame("org.apache.spark.unsafe.map.BytesToBytesMap", "safeLookup"),
        _frame("org.apache.spark.sql.execution.UnsafeFixedWidthAggregationMap", "getAggregationBufferFromUnsafeRow"),
    ]
    insert = [
        _frame("org.apache.spark.sql.execution.UnsafeFixedWidthAggregationMap", "getAggregationBufferFromUnsafeRow")
    ]
    write = [
        _frame("java.io.BufferedOutputStream", "write"),
        _frame("org.apache.spark.storage.DiskBlockObjectWriter", "write"),
    ]
    scan = [  # the shuffle writer pulls the rows it writes: the read under it is the scan's
        _frame("org.apache.parquet.column.values.bitpacking.ByteBitPackingLE$Packer17", "unpack8Values"),
        _frame("org.apache.spark.sql.execution.datasources.parquet.VectorizedRleValuesReader", "readGroup"),
        _frame("org.apache.spark.shuffle.sort.BypassMergeSortShuffleWriter", "write"),
    ]
    serialise = [  # the shuffle's serialising stream (a nested class), not its reading one
        _frame("net.jpountz.lz4.LZ4BlockOutputStream", "write"),
        _frame("org.apache.spark.storage.TimeTrackingOutputStream", "write"),
        _frame("org.apache.spark.sql.execution.UnsafeRowSerializerInstance$$anon$1", "writeValue"),
    ]
    deserialise = [_frame("org.apache.spark.sql.execution.UnsafeRowSerializerInstance$$anon$2$$anon$3", "next")]
    append = [_frame("org.apache.spark.unsafe.map.BytesToBytesMap$Location", "append")]  # a nested class's frame
    idle = [_frame("java.lang.Thread", "sleep")]
    recording = {
        "recording": {
            "events": [
                {"values": {"stackTrace": {"frames": s}}}
                for s in (lookup, lookup, insert, write, scan, idle, serialise, deserialise, append, write)
            ]
            + [{"values": {"stackTrace": None}}]  # a sample without a stack is no sample
        }
    }
    n, parts, top = profile_summary(sample_stacks(recording), top=2)
    assert n == 10
    assert parts == [
        ("hash aggregation: the map (lookups, inserts)", 0.3),
        ("shuffle write", 0.3),
        ("shuffle read", 0.1),
        ("Parquet scan", 0.1),
        ("hash aggregation: the rest", 0.1),
        ("other", 0.1),
    ]
    assert top[0] == ("org.apache.spark.unsafe.array.ByteArrayMethods.arrayEquals", 0.2)
    assert top[1] == ("java.io.BufferedOutputStream.write", 0.2)
    assert profile_summary([]) == (0, [], [])
