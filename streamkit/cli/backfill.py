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
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import typer

_LOG4J = """\
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n
"""

# API parameter names in the library's messages -> the flags a CLI user types
_FLAG_NAMES = (
    "from_start",
    "allow_partial",
    "allow_timers",
    "allow_skipped",
    "offset_col",
    "partition_col",
    "topic_col",
    "key_col",
    "value_col",
    "timestamp_col",
    "order_by",
    "partitioned_by_key",
    "p0",
    "broker",
    "topic",
)
_KEEP_LOGS = 5


def cli_message(text: str) -> str:
    """A library message in the CLI's words: ``from_start=True`` -> ``--from-start``,
    ``offset_col`` -> ``--offset-col``, ``p0=3`` -> ``--p0 3``, positions -> ``-p``."""
    text = text.replace("partitioned_by_key=False", "--shuffle")
    for name in _FLAG_NAMES:
        flag = "--" + name.replace("_", "-")
        text = re.sub(rf"(?<![\w-]){name}=True\b", flag, text)
        text = re.sub(rf"(?<![\w-]){name}=(?=\d)", flag + " ", text)
        text = re.sub(rf"(?<![\w-]){name}=(?!\S)", flag, text)
        if name not in ("topic", "broker", "p0"):
            text = re.sub(rf"(?<![\w-]){name}\b", flag, text)
    return re.sub(r"positions \(?TOPIC:PARTITION=NEXT_OFFSET\)?", "-p TOPIC:PARTITION=NEXT_OFFSET", text)


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            from streamkit.cli import CliError

            raise CliError(f"{what} {item!r} must look like KEY=VALUE")
        out[k.strip()] = v
    return out


class SparkLauncher:
    """Starts local Spark with everything the JVM prints going to one log file: log4j's
    output (at ``level``) through a file appender, and the JVM's own stdout/stderr by
    handing the launched process a log-file descriptor in place of ours."""

    def __init__(self, log_dir: Path, cores: int, conf: dict[str, str], level: str) -> None:
        self.log_dir = log_dir
        self.log_path = log_dir / f"spark-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
        self.started = False
        self._cores, self._conf, self._level = cores, dict(conf), level

    def _prepare_logs(self) -> None:
        """The log directory (the last few runs' logs) and log4j's configuration."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for old in sorted(self.log_dir.glob("spark-*.log"))[: -_KEEP_LOGS + 1]:
            old.unlink(missing_ok=True)
        if "spark.driver.extraJavaOptions" not in self._conf:
            props = self.log_dir / "log4j2.properties"
            props.write_text(_LOG4J.format(level=self._level.lower(), log=self.log_path))
            opt = f"-Dlog4j.configurationFile=file:{props} -Dlog4j2.configurationFile=file:{props}"
            self._conf["spark.driver.extraJavaOptions"] = opt
            self._conf["spark.executor.extraJavaOptions"] = opt

    def __call__(self) -> Any:
        from streamkit.spark.session import local_session

        self.started = True
        self._prepare_logs()
        with open(self.log_path, "ab") as log:
            sys.stdout.flush()
            sys.stderr.flush()
            saved = os.dup(1), os.dup(2)
            try:
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                return local_session(self._cores, conf=self._conf, log_level=self._level)
            finally:
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])

    def record(self, exc: BaseException) -> None:
        """Append a failure's whole text (a Java trace, say) to the log."""
        import traceback

        with open(self.log_path, "a") as f:
            f.write("".join(traceback.format_exception(exc)))


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
    for why, n in (d.get("left_out") or {}).items():
        t.add_row("[yellow]left out", f"{n:,} {why} (--allow-skipped)")
    if d.get("duplicates") or d.get("null_values"):
        t.add_row("duplicates / nulls", f"{d['duplicates']:,} older rows dropped, {d['null_values']:,} null values")
    tm = result.timings
    t.add_row(
        "time",
        f"{total:.1f}s total = JVM start {jvm_seconds:.1f}s + spark job {tm.get('spark', 0):.1f}s "
        f"+ build {tm.get('build', 0):.2f}s + publish {tm.get('publish', 0):.3f}s",
    )
    for w in result.warnings:
        if not w.startswith("left out:"):
            t.add_row("[yellow]warning", escape(cli_message(w)))
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
    topic_col: str | None = typer.Option(
        None, "--topic-col", help="the column naming each row's topic (replay: a history of all the app's inputs)"
    ),
    timestamp_col: str | None = typer.Option(None, "--timestamp-col"),
    order_by: str | None = typer.Option(None, "--order-by", help="replay: ordering column(s), default the offset"),
    position: list[str] = typer.Option([], "--position", "-p", help="TOPIC:PARTITION=NEXT_OFFSET (repeatable)"),
    from_start: bool = typer.Option(False, "--from-start", help="no positions: none of the history is in Kafka"),
    p0: int | None = typer.Option(None, "--p0", min=1, help="the job's initial processor count (default: the app's)"),
    processors: int | None = typer.Option(None, "--processors", min=1, help="current processor count (default p0)"),
    broker: str | None = typer.Option(
        None,
        "--broker",
        "-b",
        envvar="STREAMKIT_BROKER",
        help="the cluster the positions and processor counts are checked against (else STREAMKIT_BROKER)",
    ),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="default: the app's state_dir"),
    allow_partial: bool = typer.Option(False, "--allow-partial", help="leave the app's other tables empty"),
    keep_backup: bool = typer.Option(False, "--keep-backup", help="keep the replaced stores under .backfill/"),
    allow_timers: bool = typer.Option(False, "--allow-timers", help="replay: the app's timers do not change state"),
    allow_skipped: bool = typer.Option(
        False, "--allow-skipped", help="leave out rows without a key (or that a handler rejects) and report them"
    ),
    option: list[str] = typer.Option([], "--option", "-o", help="reader option KEY=VALUE"),
    cores: int = typer.Option(2, "--cores", min=1, help="local Spark cores"),
    spark_conf: list[str] = typer.Option([], "--spark-conf", help="Spark setting KEY=VALUE"),
    spark_log_level: str = typer.Option("ERROR", "--spark-log-level"),
    num_partitions: int | None = typer.Option(None, "--partitions", min=1, help="Spark tasks writing SST files"),
    partitioned_by_key: bool | None = typer.Option(
        None,
        "--partitioned-by-key/--shuffle",
        help="mode 1: each key's rows are in one input partition: skip the shuffle (unset: as Spark's plan says)",
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    fail_at: str | None = typer.Option(None, "--fail-at", hidden=True),
) -> None:
    """Build the app's stores from history with Spark; its processors resume from Kafka where the history ends.

    No gap and no double count: every partition the job reads needs its position (-p, the
    history's --offset-col, or --from-start), checked against the cluster before Spark
    starts; each store's checkpoint holds them. Spark's output goes to a log file under
    the state directory (named in any error)."""
    from rich.console import Console

    from streamkit.cli import CliError
    from streamkit.errors import StreamkitError
    from streamkit.loader import load_app
    from streamkit.spark.inputs import check_exists

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
        raise CliError("--replay takes one --from (the input records of --topic, or of every input with --topic-col)")
    app = load_app(app_spec)
    connection = app.connection(broker)
    if connection is None:
        raise CliError(
            "no broker: give --broker or set STREAMKIT_BROKER (positions and the processor count are "
            "checked against the cluster)"
        )
    from streamkit.spark._deps import require_spark

    require_spark()
    from streamkit.spark import BackfillOptions, backfill_replay, backfill_state

    reader_options = _pairs(option, "--option")
    conf = _pairs(spark_conf, "--spark-conf")
    state_root = Path(state_dir or app.settings.state_dir).absolute()
    launcher = SparkLauncher(state_root / app.name / "backfill-logs", cores, conf, spark_log_level)
    reporter = _RichReporter(console, progress and not as_json)

    def jvm() -> Any:
        with reporter.phase("jvm", f"start local Spark ({cores} cores)"):
            return launcher()

    options = BackfillOptions(
        key_col=key_col,
        value_col=value_col,
        key_encoded=key_encoded,
        value_encoded=value_encoded,
        topic=topic,
        topic_col=topic_col,
        partition_col=partition_col,
        offset_col=offset_col,
        reader_options=reader_options,
        positions=position or None,
        from_start=from_start,
        p0=p0,
        processors=processors,
        broker=connection,
        state_dir=state_root,
        allow_partial=allow_partial,
        allow_skipped=allow_skipped,
        keep_backup=keep_backup,
        spark=jvm,
        num_partitions=num_partitions,
        reporter=reporter,
        fail_at=fail_at,
    )
    try:
        for src in source:
            check_exists(src)
        with reporter:
            if replay:
                result = backfill_replay(
                    app,
                    source[0],
                    options,
                    tables=table or None,
                    order_by=order_by.split(",") if order_by else None,
                    timestamp_col=timestamp_col,
                    allow_timers=allow_timers,
                )
            else:
                result = backfill_state(app, dict(zip(table, source)), options, partitioned_by_key=partitioned_by_key)
    except Exception as exc:
        where = f" (Spark's output: {launcher.log_path})" if launcher.started else ""
        if launcher.started:
            launcher.record(exc)
        if isinstance(exc, StreamkitError):
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CliError(cli_message(first) + where) from None
        text = str(exc).strip().splitlines()
        raise CliError(f"{type(exc).__name__}: {text[0] if text else ''}{where}") from None
    jvm_s = reporter.timings.get("jvm", 0.0)
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
