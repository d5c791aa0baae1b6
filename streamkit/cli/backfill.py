"""`streamkit backfill MODULE:APP --table NAME --from PATH_OR_FORMAT`: build an app's stores
from history with Spark (the ``spark`` extra), then let its processors resume from Kafka.

Mode 1 (default): each ``--from`` is a DataFrame of final state, ``(key, value)`` rows, for
the ``--table`` at the same position. Mode 2 (``--replay``): ``--from`` holds the input
records of ``--topic``; the app's own handlers are replayed per key inside Spark.

Sources: ``parquet:PATH``, ``json:PATH``, ``csv:PATH``, ``orc:PATH``, ``delta:PATH``,
``table:NAME`` (a table of the Spark catalog), or a plain path (format from the extension
or the files inside; Parquet by default). ``--option k=v`` passes reader options.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import typer

FORMATS = ("parquet", "json", "csv", "orc", "text", "avro", "delta", "table")
_EXT = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
    ".csv": "csv",
    ".orc": "orc",
    ".avro": "avro",
}

_LOG4J = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n
"""


def parse_source(source: str) -> tuple[str, str]:
    """``FORMAT:PATH`` or a path -> (format, path or table name)."""
    fmt, sep, rest = source.partition(":")
    if sep and fmt.lower() in FORMATS and rest:
        return fmt.lower(), rest
    path = Path(source)
    ext = path.suffix.lower()
    if ext in _EXT:
        return _EXT[ext], source
    if path.is_dir():
        if (path / "_delta_log").is_dir():
            return "delta", source
        for f in sorted(path.rglob("*")):
            if f.suffix.lower() in _EXT:
                return _EXT[f.suffix.lower()], source
    return "parquet", source


def load_source(spark: Any, source: str, options: dict[str, str]) -> Any:
    fmt, where = parse_source(source)
    if fmt == "table":
        return spark.table(where)
    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    for k, v in options.items():
        reader = reader.option(k, v)
    if fmt != "delta" and not Path(where).exists() and "://" not in where:
        raise FileNotFoundError(f"--from {source}: no such file or directory")
    return reader.load(where)


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            from streamkit.cli import CliError

            raise CliError(f"{what} {item!r} must look like KEY=VALUE")
        out[k.strip()] = v
    return out


def _quiet_spark_logs(level: str) -> dict[str, str]:
    """A log4j2 configuration that keeps Spark's console output to ``level`` and above."""
    fd, path = tempfile.mkstemp(prefix="streamkit-log4j2-", suffix=".properties")
    with os.fdopen(fd, "w") as f:
        f.write(_LOG4J.format(level=level.lower()))
    opt = f"-Dlog4j.configurationFile=file:{path} -Dlog4j2.configurationFile=file:{path}"
    return {"spark.driver.extraJavaOptions": opt, "spark.executor.extraJavaOptions": opt}


class _RichReporter:
    """Phases with a spinner and elapsed time, plus a bar of the Spark job's tasks."""

    def __init__(self, console: Any, enabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        from streamkit.spark.backfill import Reporter

        self.base = Reporter()
        self.timings = self.base.timings
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
            transient=False,
        )
        self._tasks: dict[str, Any] = {}
        self._poll: threading.Thread | None = None
        self._stop = threading.Event()

    def __enter__(self) -> _RichReporter:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self.progress.stop()

    # Reporter interface -------------------------------------------------------------------
    def phase(self, name: str, description: str = "") -> Any:
        reporter = self

        class _Ctx:
            def __enter__(self) -> None:
                self.t0 = time.perf_counter()
                reporter._tasks[name] = reporter.progress.add_task(f"{name}: {description}", total=None)

            def __exit__(self, *exc: Any) -> None:
                dt = time.perf_counter() - self.t0
                reporter.timings[name] = reporter.timings.get(name, 0.0) + dt
                task = reporter._tasks[name]
                ok = exc[0] is None
                reporter.progress.update(
                    task,
                    total=1,
                    completed=1 if ok else 0,
                    description=f"{name}: {description} {'done' if ok else 'FAILED'}",
                )
                reporter.progress.stop_task(task)

        return _Ctx()

    def spark_job(self, spark: Any, group: str) -> None:
        tracker = spark.sparkContext.statusTracker()
        task = self.progress.add_task("  spark tasks", total=None)
        seen: dict[int, tuple[int, int]] = {}

        def refresh() -> None:
            try:
                for job_id in tracker.getJobIdsForGroup(group):
                    job = tracker.getJobInfo(job_id)
                    for sid in job.stageIds if job is not None else ():
                        st = tracker.getStageInfo(sid)
                        if st is not None:
                            seen[sid] = (st.numCompletedTasks, st.numTasks)
            except Exception:  # noqa: BLE001 - progress must never break the job
                return
            done = sum(c for c, _ in seen.values())
            total = sum(t for _, t in seen.values())
            self.progress.update(
                task, completed=done, total=total or None, description=f"  spark tasks ({len(seen)} stage(s))"
            )

        def poll() -> None:
            while not self._stop.wait(0.3):
                refresh()
            refresh()

        self._spark_task = task
        self._stop.clear()
        self._poll = threading.Thread(target=poll, name="backfill-progress", daemon=True)
        self._poll.start()

    def spark_job_done(self, ok: bool) -> None:
        self._stop.set()
        if self._poll is not None:
            self._poll.join(timeout=5)
            self._poll = None
        if ok:  # the listener bus lags: show the finished job as finished
            for t in self.progress.tasks:
                if t.id == self._spark_task and t.total:
                    self.progress.update(t.id, completed=t.total)


def _summary(console: Any, result: Any, jvm_seconds: float, total: float) -> None:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"backfill of {result.app} ({result.mode})", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("rows read", f"{result.rows_read:,}")
    for name, n in sorted(result.keys_written.items()):
        t.add_row(f"keys written ({name})", f"{n:,}")
    t.add_row("stores published", f"{result.stores_published} (p0={result.p0}, processors={result.processors})")
    t.add_row("store directory", str(Path(result.store_paths[0]).parent) if result.store_paths else "-")
    by_topic: dict[str, list[int]] = {}
    for (topic, _part), nxt in result.positions.items():
        by_topic.setdefault(topic, []).append(nxt)
    for topic, offs in sorted(by_topic.items()):
        t.add_row(f"resume ({topic})", f"{len(offs)} partition(s), next offsets {min(offs):,}..{max(offs):,}")
    d = result.details
    if d.get("duplicates") or d.get("null_values"):
        t.add_row("duplicates / nulls", f"{d['duplicates']:,} older rows dropped, {d['null_values']:,} null values")
    tm = result.timings
    t.add_row(
        "time",
        f"{total:.1f}s total = JVM start {jvm_seconds:.1f}s + spark job {tm.get('spark', 0):.1f}s "
        f"+ build {tm.get('build', 0):.2f}s + publish {tm.get('publish', 0):.3f}s",
    )
    for w in result.warnings:
        t.add_row("[yellow]warning", escape(w))
    console.print(t)


def backfill(
    app_spec: str = typer.Argument(..., metavar="MODULE:APP", help="the App, e.g. examples.orders:app"),
    table: list[str] = typer.Option([], "--table", "-t", help="table to write (repeat with --from for several)"),
    source: list[str] = typer.Option([], "--from", "-f", help="PATH or FORMAT:PATH or table:NAME (one per --table)"),
    replay: bool = typer.Option(False, "--replay", help="mode 2: --from holds input records; replay the handlers"),
    topic: str | None = typer.Option(None, "--topic", help="replay: the input topic (default: the app's only one)"),
    key_col: str = typer.Option("key", "--key-col"),
    value_col: str = typer.Option("value", "--value-col", help="a column, or a,b,c for an object of columns"),
    key_encoded: bool = typer.Option(False, "--key-encoded", help="keys are already the stored/record bytes"),
    value_encoded: bool = typer.Option(False, "--value-encoded", help="values are already the stored/record bytes"),
    partition_col: str | None = typer.Option(None, "--partition-col"),
    offset_col: str | None = typer.Option(None, "--offset-col", help="positions = highest offset + 1 per partition"),
    topic_col: str | None = typer.Option(None, "--topic-col"),
    timestamp_col: str | None = typer.Option(None, "--timestamp-col"),
    order_by: str | None = typer.Option(None, "--order-by", help="replay: ordering column(s), default the offset"),
    position: list[str] = typer.Option([], "--position", "-p", help="TOPIC:PARTITION=NEXT_OFFSET (repeatable)"),
    from_start: bool = typer.Option(False, "--from-start", help="no positions: none of the history is in Kafka"),
    p0: int | None = typer.Option(None, "--p0", min=1, help="the job's initial processor count (default: the app's)"),
    processors: int | None = typer.Option(None, "--processors", min=1, help="current processor count (default p0)"),
    broker: str | None = typer.Option(
        None, "--broker", "-b", help="check/record p0 in the cluster (default: the app's broker)"
    ),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="default: the app's state_dir"),
    allow_partial: bool = typer.Option(False, "--allow-partial", help="leave the app's other tables empty"),
    keep_backup: bool = typer.Option(False, "--keep-backup", help="keep the replaced stores under .backfill/"),
    allow_timers: bool = typer.Option(False, "--allow-timers", help="replay: the app's timers do not change state"),
    option: list[str] = typer.Option([], "--option", "-o", help="reader option KEY=VALUE"),
    cores: int = typer.Option(2, "--cores", min=1, help="local Spark cores"),
    spark_conf: list[str] = typer.Option([], "--spark-conf", help="Spark setting KEY=VALUE"),
    spark_log_level: str = typer.Option("ERROR", "--spark-log-level"),
    num_partitions: int | None = typer.Option(None, "--partitions", min=1, help="Spark tasks writing SST files"),
    partitioned_by_key: bool = typer.Option(
        False, "--partitioned-by-key", help="mode 1: each key's rows are in one input partition: skip the shuffle"
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    fail_at: str | None = typer.Option(None, "--fail-at", hidden=True),
) -> None:
    """Build the app's stores from history with Spark; its processors resume from Kafka where the history ends.

    No gap and no double count: each store's checkpoint holds the next offset of every partition."""
    from rich.console import Console

    from streamkit.cli import CliError
    from streamkit.loader import load_app

    t0 = time.perf_counter()
    console = Console(stderr=True)
    if not source:
        raise CliError("give the history with --from PATH_OR_FORMAT")
    if not replay:
        if not table:
            raise CliError("give the table to write with --table NAME (mode 1), or --replay")
        if len(source) != len(table):
            raise CliError(f"{len(table)} --table but {len(source)} --from: give one --from per --table")
    elif len(source) != 1:
        raise CliError("--replay takes one --from (the input records of --topic)")
    app = load_app(app_spec)
    from streamkit.spark._deps import require_spark

    require_spark()
    from streamkit.spark import backfill_replay, backfill_state
    from streamkit.spark.session import local_session

    reader_options = _pairs(option, "--option")
    conf = _pairs(spark_conf, "--spark-conf")
    if "spark.driver.extraJavaOptions" not in conf:
        conf.update(_quiet_spark_logs(spark_log_level))
    reporter = _RichReporter(console, progress and not as_json)
    common: dict[str, Any] = dict(
        key_col=key_col,
        value_col=value_col,
        key_encoded=key_encoded,
        value_encoded=value_encoded,
        partition_col=partition_col,
        offset_col=offset_col,
        positions=position or None,
        from_start=from_start,
        p0=p0,
        processors=processors,
        broker=broker,
        state_dir=state_dir,
        allow_partial=allow_partial,
        keep_backup=keep_backup,
        num_partitions=num_partitions,
        reporter=reporter,
        fail_at=fail_at,
    )
    with reporter:
        with reporter.phase("jvm", f"start local Spark ({cores} cores)"):
            spark = local_session(cores, conf=conf, log_level=spark_log_level)
        jvm_s = reporter.timings["jvm"]
        if replay:
            df = load_source(spark, source[0], reader_options)
            result = backfill_replay(
                app,
                df,
                spark=spark,
                topic=topic,
                order_by=order_by.split(",") if order_by else None,
                timestamp_col=timestamp_col,
                tables=table or None,
                allow_timers=allow_timers,
                **common,
            )
        else:
            frames = {name: load_source(spark, src, reader_options) for name, src in zip(table, source)}
            result = backfill_state(
                app,
                frames,
                spark=spark,
                topic=topic,
                topic_col=topic_col,
                partitioned_by_key=partitioned_by_key,
                **common,
            )
    total = time.perf_counter() - t0
    if as_json:
        doc = {
            "app": result.app,
            "mode": result.mode,
            "tables": result.tables,
            "rows_read": result.rows_read,
            "keys_written": result.keys_written,
            "stores_published": result.stores_published,
            "store_paths": result.store_paths,
            "p0": result.p0,
            "processors": result.processors,
            "positions": [[t, p, o] for (t, p), o in result.positions.items()],
            "seconds": total,
            "jvm_seconds": jvm_s,
            "timings": result.timings,
            "details": result.details,
            "warnings": result.warnings,
            "run_id": result.run_id,
        }
        sys.stdout.write(json.dumps(doc) + "\n")
    else:
        _summary(Console(), result, jvm_s, total)


def register(cli: typer.Typer) -> None:
    cli.command("backfill")(backfill)
