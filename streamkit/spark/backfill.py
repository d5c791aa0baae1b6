"""Backfill an app's stores from Spark: the driver side of both modes.

Mode 1, :func:`backfill_state`: a DataFrame of final state, ``(key, value)`` rows per
table. Mode 2, :func:`backfill_replay`: a DataFrame of historical input records; the
app's own handlers run over each key's records in order (``streamkit.replay``).

Both run one Spark job::

    input --mapInArrow(stage A: encode, hash, place)--> repartition(bucket)
          --sortWithinPartitions(bucket, key, order)--> mapInArrow(stage B: SSTs) --> collect

then, on the driver, ingest each processor's SST files into a fresh store stamped with
the checkpoint positions, and publish all stores atomically (:mod:`.staging`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stores.base import Checkpoint
from stores.serde import RawSerde

from streamkit.app import App
from streamkit.errors import ConfigError, ReplayError
from streamkit.spark._deps import require
from streamkit.spark.staging import BackfillError, InjectedFailure, Staging, check_fail
from streamkit.spark import tasks

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

__all__ = [
    "BackfillResult",
    "Reporter",
    "backfill_replay",
    "backfill_state",
    "backfill_table",
    "parse_positions",
    "spark_partition_keys",
]

Positions = Mapping[tuple[str, int], int]


# --------------------------------------------------------------------------- results


@dataclass
class BackfillResult:
    """What a backfill did (the CLI prints it as the summary)."""

    app: str
    mode: str
    tables: list[str]
    p0: int
    processors: int
    rows_read: int
    keys_written: dict[str, int]
    stores_published: int
    store_paths: list[str]
    positions: dict[tuple[str, int], int]
    run_id: str
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def keys_total(self) -> int:
        return sum(self.keys_written.values())


class Reporter:
    """Progress hooks (no-op here; the CLI draws them). ``phase`` wraps each step."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str, description: str = "") -> Iterator[None]:
        t0 = time.perf_counter()
        self.started(name, description)
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            self.timings[name] = self.timings.get(name, 0.0) + dt
            self.finished(name, dt)

    def started(self, name: str, description: str) -> None:
        log.info("backfill: %s%s", name, f" ({description})" if description else "")

    def finished(self, name: str, seconds: float) -> None:
        log.info("backfill: %s done in %.2fs", name, seconds)

    def spark_job(self, spark: "SparkSession", group: str) -> None:
        """Called right before the Spark job of job group ``group`` starts."""

    def spark_job_done(self, ok: bool) -> None:
        """Called right after the Spark job finishes (``ok``) or fails."""


# --------------------------------------------------------------------------- helpers


def parse_positions(spec: Any) -> dict[tuple[str, int], int]:
    """Positions from ``{(topic, part): next}``, ``{topic: {part: next}}`` or strings
    ``"topic:part=next"`` (a list or one comma-separated string)."""
    out: dict[tuple[str, int], int] = {}
    if spec is None:
        return out
    if isinstance(spec, str):
        spec = [s for s in spec.split(",") if s.strip()]
    if isinstance(spec, Mapping):
        for k, v in spec.items():
            if isinstance(k, tuple):
                out[(str(k[0]), int(k[1]))] = int(v)
            elif isinstance(v, Mapping):
                for part, off in v.items():
                    out[(str(k), int(part))] = int(off)
            else:
                raise ConfigError(f"positions: cannot read {k!r}: {v!r}")
        return out
    for item in spec:
        m = re.fullmatch(r"\s*(.+):(\d+)=(\d+)\s*", str(item))
        if not m:
            raise ConfigError(f"position {item!r} must look like TOPIC:PARTITION=NEXT_OFFSET")
        out[(m.group(1), int(m.group(2)))] = int(m.group(3))
    return out


def _murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of an IntegerType value (Murmur3_x86_32.hashInt), signed."""
    m = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & m

    k1 = (value & m) * 0xCC9E2D51 & m
    k1 = rotl(k1, 15) * 0x1B873593 & m
    h1 = seed ^ k1
    h1 = (rotl(h1, 13) * 5 + 0xE6546B64) & m
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & m
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & m
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def spark_partition_keys(n: int) -> list[int]:
    """For each Spark partition ``i < n``, an int whose hash partitioning lands in ``i``.

    ``repartition(n, col)`` places a row in ``pmod(hash(col), n)``; shuffling on these
    keys (``_sp``) instead of the bucket ids spreads buckets exactly round-robin, where
    Spark's own hash of small ints would leave some tasks empty and others doubled.
    """
    keys: dict[int, int] = {}
    x = 0
    while len(keys) < n:
        keys.setdefault(_murmur3_int(x) % n, x)
        x += 1
    return [keys[i] for i in range(n)]


def _find_ref(app: App) -> str | None:
    """``module:attr`` under which ``app`` is importable (not ``__main__``)."""
    for name, module in list(sys.modules.items()):
        if module is None or name == "__main__" or name.startswith(("pyspark", "py4j", "numpy", "pandas")):
            continue
        try:
            attrs = vars(module)
        except TypeError:
            continue
        for attr, value in list(attrs.items()):
            if value is app:
                return f"{name}:{attr}"
    return None


def _resolve_app(app: App | str) -> tuple[App, str | None]:
    if isinstance(app, str):
        from streamkit.loader import load_app

        return load_app(app), app
    if not isinstance(app, App):
        raise TypeError(f"expected a streamkit.App or 'module:attr', got {type(app).__name__}")
    return app, _find_ref(app)


def _counts(app: App, p0: int | None, processors: int | None, broker: str | None) -> tuple[int, int, list[str]]:
    """The job's initial processor count p0 and the current count p, checked against (and
    recorded in) the cluster when a broker is known: placement of every key depends on
    p0, so a backfill made for one p0 must never be opened by a job running another."""
    notes: list[str] = []
    bootstrap = broker or app.settings.broker
    configured = p0 if p0 is not None else app.processor_count
    if bootstrap is None:
        if configured is None:
            raise ConfigError(
                f"app {app.name!r} does not fix its processor count (processors=None: decided at first "
                "start); pass p0= (CLI: --p0) with the job's initial processor count, or broker= to read it"
            )
        notes.append(
            f"p0={configured} was not checked against the cluster (no broker given): start the job with "
            f"processors={configured}"
        )
        p0 = configured
    else:
        import asyncio

        from streamkit.errors import JobMismatchError
        from streamkit.runtime.jobmeta import recorded_processor_count, resolve_processor_count

        try:
            if configured is None:
                p0 = asyncio.run(recorded_processor_count(bootstrap, app.name))
                if p0 is None:
                    raise ConfigError(
                        f"job {app.name!r} has not started yet and does not fix its processor count; "
                        "pass p0= (CLI: --p0)"
                    )
            else:
                # records p0 for a job that has not started yet: its workers must then agree
                p0 = asyncio.run(resolve_processor_count(bootstrap, app.name, configured, configured))
        except JobMismatchError as exc:
            message = str(exc).split(". The initial")[0].replace("this worker is configured with", "this backfill uses")
            raise ConfigError(f"{message}; a backfill must use the job's initial processor count") from None
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - unreachable broker etc.: one line
            raise ConfigError(f"cannot check the job's processor count at {bootstrap}: {type(exc).__name__}: {exc}") from None
    p = processors if processors is not None else p0
    if p0 < 1 or p < p0:
        raise ConfigError(f"processor counts must satisfy 1 <= p0 <= processors, got p0={p0}, processors={p}")
    return int(p0), int(p), notes


def _value_expr(F: Any, value_col: str | Sequence[str]) -> "Column":
    if isinstance(value_col, str):
        if "," in value_col:
            value_col = [c.strip() for c in value_col.split(",") if c.strip()]
        else:
            return F.col(value_col)
    return F.struct(*[F.col(c) for c in value_col])


def _check_columns(df: "DataFrame", names: Sequence[str | None], what: str) -> None:
    have = set(df.columns)
    missing = [n for n in names if n is not None and n not in have]
    if missing:
        raise ConfigError(f"{what}: column(s) {missing} not found; the DataFrame has {sorted(have)}")


def _translate(exc: BaseException) -> BaseException | None:
    """A Spark failure -> the task's own one-line error (or the last line of the Python
    traceback of a task that failed otherwise); None if it is not a task failure."""
    text = str(exc)
    m = re.search(re.escape(tasks.ERROR_MARK) + r"(\w+)\|(.*?)" + re.escape(tasks.ERROR_END), text, re.S)
    if m is None:
        if "Traceback (most recent call last)" not in text:
            return None
        python_part = text.split("Traceback (most recent call last)", 1)[1].split("\n\tat ", 1)[0]
        lines = [ln.strip() for ln in python_part.splitlines() if ln.strip()]
        errors = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt|Warning)\b.*", ln)]
        last = errors[-1] if errors else (lines[-1] if lines else "unknown error")
        return BackfillError(f"a Spark task failed: {last}")
    kind, message = m.group(1), m.group(2)
    if kind == "replay":
        return ReplayError(message)
    if kind == "injected":
        return InjectedFailure(message)
    return BackfillError(message)


@dataclass
class _Plan:
    """The shared part of both modes (what the driver needs to run and publish)."""

    app: App
    mode: str
    tables: list[str]  # tables written
    p0: int
    p: int
    subs: int
    num_partitions: int
    state_dir: Path
    positions: dict[tuple[str, int], int]
    derive_positions: bool
    topics: list[str]  # topics the positions must cover
    layout_epochs: dict[str, int]
    allow_partial: bool
    from_start: bool
    fail_at: str | None
    keep_backup: bool
    topic_partitions: dict[str, tuple[int, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    verify_unique: bool = False  # fused mode 1: check that no key was written twice


def _layouts(spec: Mapping[str, int | tuple[int, int]] | None) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for topic, v in (spec or {}).items():
        n0, n = (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))
        if not 1 <= n0 <= n:
            raise ConfigError(f"topic_partitions[{topic!r}] must be N or (N0, N) with 1 <= N0 <= N, got {v!r}")
        out[topic] = (n0, n)
    return out


def _layout(spark: "SparkSession", p: int, num_partitions: int | None, subs: int | None) -> tuple[int, int]:
    par = max(1, spark.sparkContext.defaultParallelism)
    target = max(2 * par, p)
    if subs is None:
        subs = max(1, math.ceil(target / p))
    n = num_partitions or min(p * subs, max(target, p))
    return subs, n


# --------------------------------------------------------------------------- the run


def _run(
    plan: _Plan,
    spark: "SparkSession",
    build: Callable[[Staging, int, int, list[int], Any], "DataFrame"],
    reporter: Reporter,
) -> BackfillResult:
    t_start = time.perf_counter()
    app = plan.app
    app_dir = plan.state_dir / app.name
    warnings: list[str] = list(plan.notes)
    with Staging(app_dir, fail_at=plan.fail_at, keep_backup=plan.keep_backup) as staging:
        if staging.recovered:
            warnings.append("rolled back a publish that an earlier backfill left unfinished")
        staging.check_live_unlocked(range(plan.p))
        staging.prepare_sst_dirs(range(plan.p), plan.tables)
        sc = spark.sparkContext
        acc = sc.accumulator(0.0)
        group = f"streamkit-backfill-{staging.run_id}"
        sc.setJobGroup(group, f"streamkit backfill of {app.name} ({plan.mode})", interruptOnCancel=True)
        old_batch = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "65536")
        try:
            with reporter.phase("spark", "encode, place, shuffle, sort, write SST files"):
                df = build(staging, plan.subs, plan.num_partitions, spark_partition_keys(plan.num_partitions), acc)
                reporter.spark_job(spark, group)
                ok = False
                try:
                    rows = df.collect()
                    ok = True
                except Exception as exc:  # noqa: BLE001 - Py4J / PythonException
                    clean = _translate(exc)
                    if clean is not None:
                        raise clean from None
                    raise
                finally:
                    reporter.spark_job_done(ok)
        finally:
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", old_batch)
            sc.setLocalProperty("spark.jobGroup.id", None)
            sc.setLocalProperty("spark.job.description", None)
        check_fail("after-spark", plan.fail_at)

        # -- what the tasks did -----------------------------------------------------------
        ssts: dict[int, dict[str, list[str]]] = {p: {} for p in range(plan.p)}
        ssts_keys: dict[int, dict[str, int]] = {p: {} for p in range(plan.p)}
        keys_written = {t: 0 for t in plan.tables}
        max_off: dict[tuple[str, int], int] = {}
        owners: dict[tuple[str, int], set[int]] = {}
        rows_read = 0
        task_s = write_s = replay_s = wait_s = fused_a = 0.0
        infos: list[str] = []
        dups = nulls = handler_errors = skipped = 0
        for r in rows:
            if r.kind == "sst":
                ssts[r.proc].setdefault(r.table, []).append(r.path)
                ssts_keys[r.proc][r.table] = ssts_keys[r.proc].get(r.table, 0) + r.keys
                keys_written[r.table] = keys_written.get(r.table, 0) + r.keys
                write_s += r.seconds or 0.0
            elif r.kind == "offset":
                key = (r.topic, r.part)
                max_off[key] = max(max_off.get(key, -1), r.max_off)
                owners.setdefault(key, set()).add(r.proc)
            elif r.kind == "stats":
                rows_read += r.rows or 0
                task_s += r.seconds or 0.0
                head, _, rest = (r.info or "").partition("\n")
                for item in head.split():
                    k, _, v = item.partition("=")
                    if k == "dups":
                        dups += int(v)
                    elif k == "nulls":
                        nulls += int(v)
                    elif k == "handler_errors":
                        handler_errors += int(v)
                    elif k == "skipped_decode":
                        skipped += int(v)
                if rest:
                    infos.extend(rest.splitlines())
            elif r.kind == "timing" and r.info == "replay":
                replay_s += r.seconds or 0.0
            elif r.kind == "timing" and r.info == "input_wait":
                wait_s += r.seconds or 0.0
            elif r.kind == "timing" and r.info == "stage_a":
                fused_a += r.seconds or 0.0
        if handler_errors or skipped:
            warnings.append(
                f"{handler_errors} handler error(s) and {skipped} undecodable record(s) were skipped, "
                "as the worker skips them (dead letters): " + "; ".join(infos[:3])
            )

        positions = _final_positions(plan, max_off)
        per_proc, stamped_everywhere = _stamp(plan, positions, owners)
        if stamped_everywhere:
            warnings.append(
                f"no partition data for {sorted(stamped_everywhere)}: their positions are stamped into every "
                "store (give the partition column or topic_partitions to stamp only their owners)"
            )

        # -- stores --------------------------------------------------------------------------
        extra = {"backfill": {"mode": plan.mode, "tables": sorted(plan.tables), "p0": plan.p0, "processors": plan.p}}
        all_tables = sorted(app.tables)
        with reporter.phase("build", f"ingest SST files into {plan.p} fresh store(s)"):
            for proc in range(plan.p):
                files = {t: sorted(fs) for t, fs in ssts[proc].items()}
                checkpoint = Checkpoint(positions=per_proc[proc], layout_epochs=dict(plan.layout_epochs), extra=extra)
                path = staging.build_store(proc, all_tables, files, checkpoint)
                if plan.verify_unique:
                    _verify_unique(path, files, ssts_keys[proc])
                if proc == 0:
                    check_fail("build", plan.fail_at)
        with reporter.phase("publish", "swap the new stores in atomically"):
            published = staging.publish(plan.p)
    seconds = time.perf_counter() - t_start
    timings = dict(reporter.timings)
    timings["tasks_stage_a_cpu"] = float(acc.value) + fused_a
    timings["tasks_stage_b_cpu"] = task_s
    timings["tasks_sst_write_cpu"] = write_s
    timings["tasks_stage_b_input_wait"] = wait_s
    if plan.mode == "replay":
        timings["tasks_replay_cpu"] = replay_s
    return BackfillResult(
        app=app.name,
        mode=plan.mode,
        tables=sorted(plan.tables),
        p0=plan.p0,
        processors=plan.p,
        rows_read=rows_read,
        keys_written=keys_written,
        stores_published=len(published),
        store_paths=[str(p) for p in published],
        positions=dict(sorted(positions.items())),
        run_id=staging.run_id,
        seconds=seconds,
        timings=timings,
        details={"duplicates": dups, "null_values": nulls, "handler_errors": handler_errors,
                 "skipped_decode": skipped, "buckets": plan.p * plan.subs, "spark_partitions": plan.num_partitions},
        warnings=warnings,
    )


def _verify_unique(path: Path, files: Mapping[str, Sequence[str]], written: Mapping[str, int]) -> None:
    """A store built from several SST files per table holds each key once only if no key
    was in two files: count the keys (fused mode 1, where the input's partitioning by key
    is the caller's promise)."""
    from stores.rocksdb import RocksDBStore

    store = RocksDBStore.open(str(path), create=False)
    try:
        for table, n in written.items():
            if len(files.get(table, ())) < 2:
                continue
            have = sum(1 for _ in store.items(table))
            if have != n:
                raise BackfillError(
                    f"table {table!r}: {n - have} key(s) were written by two tasks: the DataFrame is not "
                    "partitioned by key (drop partitioned_by_key / --partitioned-by-key)"
                )
    finally:
        store.close()


def _stamp(
    plan: _Plan, positions: Mapping[tuple[str, int], int], owners: Mapping[tuple[str, int], set[int]]
) -> tuple[dict[int, dict[tuple[str, int], int]], set[tuple[str, int]]]:
    """Which processors' checkpoints get which positions.

    A processor's checkpoint says "every record before these positions is reflected in
    this store", so a position goes to the processors that own keys of that partition,
    exactly as the runtime's own checkpoints hold only the partitions a processor reads:
    known from the history itself (rows of the partition placed on the processor) or,
    failing that, from the topic layout (``topic_partitions``). With neither, the
    position goes to every store (reported as a warning).
    """
    per_proc: dict[int, dict[tuple[str, int], int]] = {p: {} for p in range(plan.p)}
    layout_owners: dict[tuple[str, int], set[int]] = {}
    if plan.topic_partitions:
        from assignors.placement import assign_partitions

        assignment = assign_partitions(plan.topic_partitions, plan.p0, plan.p)
        for proc, slots in assignment.items():
            for topic, part, _filter in slots:
                layout_owners.setdefault((topic, part), set()).add(proc)
    for tp, procs in owners.items():
        expected = layout_owners.get(tp)
        if expected is not None and not procs <= expected:
            raise BackfillError(
                f"keys of {tp[0]}[{tp[1]}] in the history are placed on processor(s) {sorted(procs - expected)}, "
                f"but the topic layout gives that partition to {sorted(expected)}: the key bytes differ from the "
                "producer's (check the key serde / --key-encoded) or the producer used another partitioner"
            )
    everywhere: set[tuple[str, int]] = set()
    for tp, nxt in positions.items():
        procs = owners.get(tp) or layout_owners.get(tp)
        if procs is None and plan.topic_partitions and tp[0] in plan.topic_partitions:
            raise BackfillError(f"position {tp[0]}:{tp[1]} is outside topic {tp[0]!r}'s layout {plan.topic_partitions[tp[0]]}")
        if procs is None:
            everywhere.add(tp)
            procs = set(range(plan.p))
        for proc in procs:
            per_proc[proc][tp] = nxt
    return per_proc, everywhere


def _final_positions(plan: _Plan, max_off: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    derived = {k: v + 1 for k, v in max_off.items()}
    positions = dict(plan.positions)
    for (topic, part), nxt in derived.items():
        given = positions.get((topic, part))
        if given is None:
            positions[(topic, part)] = nxt
        elif nxt > given:
            raise BackfillError(
                f"the history holds {topic}[{part}] offset {nxt - 1}, but processors are to resume at "
                f"{given}: records {given}..{nxt - 1} would be counted twice; fix the positions"
            )
    unknown = sorted({t for t, _ in positions} - set(plan.app.input_topics))
    if unknown:
        raise BackfillError(
            f"positions name topic(s) {unknown} that app {plan.app.name!r} does not consume "
            f"(its input topics: {plan.app.input_topics})"
        )
    if not plan.from_start:
        covered = {t for t, _ in positions}
        missing = [t for t in plan.topics if t not in covered]
        if missing:
            how = (
                "the offset column had no values for it" if plan.derive_positions
                else "give positions (TOPIC:PARTITION=NEXT) or an offset column"
            )
            raise BackfillError(
                f"no resume position for topic(s) {missing}: processors would read them from their first "
                f"offset and count the history twice ({how}; or from_start=True if none of the history "
                "is in Kafka)"
            )
    return positions


def _common_checks(app: App, tables: Sequence[str], mode: str, allow_partial: bool) -> None:
    for name in tables:
        if name not in app.tables:
            raise ConfigError(f"app {app.name!r} has no table {name!r} (tables: {sorted(app.tables)})")
    if not allow_partial:
        others = sorted(set(app.tables) - set(tables))
        if others:
            raise ConfigError(
                f"app {app.name!r} also has table(s) {others}, which this backfill would leave empty while "
                "the processors resume after the history; backfill them too, or pass allow_partial=True "
                "(CLI: --allow-partial)"
            )


def _spark(spark: "SparkSession | None") -> "SparkSession":
    require("pyspark")
    require("pyarrow")
    from streamkit.spark.session import check_session, local_session

    if spark is None:
        return local_session()
    check_session(spark)
    return spark


# --------------------------------------------------------------------------- mode 1


def backfill_state(
    app: App | str,
    tables: Mapping[str, "DataFrame"],
    *,
    spark: "SparkSession | None" = None,
    key_col: str = "key",
    value_col: str | Sequence[str] = "value",
    key_encoded: bool = False,
    value_encoded: bool = False,
    positions: Any = None,
    topic: str | None = None,
    topic_col: str | None = None,
    partition_col: str | None = None,
    offset_col: str | None = None,
    from_start: bool = False,
    p0: int | None = None,
    processors: int | None = None,
    broker: str | None = None,
    state_dir: str | Path | None = None,
    layout_epochs: Mapping[str, int] | None = None,
    topic_partitions: Mapping[str, int | tuple[int, int]] | None = None,
    allow_partial: bool = False,
    num_partitions: int | None = None,
    subs: int | None = None,
    partitioned_by_key: bool = False,
    keep_backup: bool = False,
    reporter: Reporter | None = None,
    fail_at: str | None = None,
) -> BackfillResult:
    """Mode 1: write the stores from DataFrames of final state, ``{table: df}``.

    Each DataFrame holds ``(key, value)`` rows (``value_col`` may name several columns,
    which become a struct / JSON object). Keys and values are encoded with the table's
    serdes (or taken as stored bytes with ``key_encoded`` / ``value_encoded``); a null
    value means "no state". Resume positions: ``positions`` (``{(topic, part): next}``
    or ``["topic:part=next", ...]``) and/or an offset column (with ``partition_col`` and
    ``topic_col`` or ``topic``), from which each partition's position is its highest
    offset + 1 and duplicate keys resolve to the highest offset.

    ``partitioned_by_key=True`` says every key's rows are in one partition of each
    DataFrame (true of the output of ``groupBy(key)``, ``repartition(key)``): the job then
    skips its own shuffle and sort (each task sorts its partition in Arrow, in memory)
    and the built stores are checked to hold every written key exactly once.
    """
    F = require("pyspark.sql.functions")
    app_obj, _ = _resolve_app(app)
    names = list(tables)
    if not names:
        raise ConfigError("no table to backfill")
    _common_checks(app_obj, names, "state", allow_partial)
    for name in names:
        if app_obj.tables[name].window is not None:
            raise ConfigError(
                f"table {name!r} is windowed; backfill from final state supports plain tables only "
                "(replay the history with backfill_replay instead)"
            )
    if offset_col is not None and partition_col is None:
        raise ConfigError("offset_col needs partition_col (and topic_col or topic)")
    if offset_col is not None and topic_col is None and topic is None:
        inputs = app_obj.input_topics
        if len(inputs) != 1:
            raise ConfigError(f"offset_col needs topic= or topic_col (app consumes {inputs})")
        topic = inputs[0]
    p0_, p, notes = _counts(app_obj, p0, processors, broker)
    spark = _spark(spark)
    subs_, nparts = _layout(spark, p, num_partitions, subs)
    plan = _Plan(
        app=app_obj, mode="state", tables=names, p0=p0_, p=p, subs=subs_, num_partitions=nparts,
        state_dir=Path(state_dir or app_obj.settings.state_dir).absolute(),
        positions=parse_positions(positions), derive_positions=offset_col is not None,
        topics=app_obj.input_topics, layout_epochs=dict(layout_epochs or {}),
        allow_partial=allow_partial, from_start=from_start, fail_at=fail_at, keep_backup=keep_backup,
        topic_partitions=_layouts(topic_partitions), notes=notes,
    )
    if not plan.positions and offset_col is None and not from_start:
        raise ConfigError(
            "no resume positions: give positions (TOPIC:PARTITION=NEXT_OFFSET) or an offset column of the "
            "history (offset_col + partition_col), or from_start=True if none of the history is in Kafka"
        )
    normalized: list["DataFrame"] = []
    for name in names:
        df = tables[name]
        cols = [c for c in (key_col if isinstance(key_col, str) else None, topic_col, partition_col, offset_col)]
        _check_columns(df, cols, f"table {name!r}")
        sel = [F.col(key_col).alias("key"), _value_expr(F, value_col).alias("value")]
        if topic_col:
            sel.append(F.col(topic_col).cast("string").alias("topic"))
        if partition_col:
            sel.append(F.col(partition_col).cast("int").alias("partition"))
        if offset_col:
            sel.append(F.col(offset_col).cast("long").alias("offset"))
        normalized.append(df.select(*sel))
    codecs = tuple(
        tasks.TableCodec(n, app_obj.tables[n].key_serde, app_obj.tables[n].value_serde, key_encoded, value_encoded)
        for n in names
    )
    large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"

    def build(staging: Staging, subs: int, n: int, sp_keys: list[int], acc: Any) -> "DataFrame":
        spec = tasks.Spec(
            mode="state", p0=p0_, p=p, subs=subs, sst_root=str(staging.sst_root), large_binary=large,
            key_col="key", value_col="value", topic=topic,
            topic_col="topic" if topic_col else None,
            partition_col="partition" if partition_col else None,
            offset_col="offset" if offset_col else None,
            tables=codecs, fail_at=fail_at, extra={"sp_keys": sp_keys},
        )
        if partitioned_by_key:
            spec = dataclasses.replace(spec, extra={**spec.extra, "fused": True})
            metas = [df.mapInArrow(functools.partial(tasks.fused_state, spec, i), tasks.META_DDL)
                     for i, df in enumerate(normalized)]
            return functools.reduce(lambda x, y: x.unionByName(y), metas)
        staged = None
        for i, df in enumerate(normalized):
            out = df.mapInArrow(functools.partial(_timed, tasks.place_state, acc, spec, i), _STATE_A_DDL)
            staged = out if staged is None else staged.unionByName(out)
        assert staged is not None
        return (
            staged.repartition(n, "_sp")
            .sortWithinPartitions("_b", "_t", "_k", "_off")
            .drop("_sp")
            .mapInArrow(functools.partial(tasks.write_state, spec), tasks.META_DDL)
        )

    plan.verify_unique = partitioned_by_key
    return _run(plan, spark, build, reporter or Reporter())


def backfill_table(app: App | str, table: str, df: "DataFrame", **options: Any) -> BackfillResult:
    """Mode 1 for one table: ``backfill_state(app, {table: df}, **options)``."""
    return backfill_state(app, {table: df}, **options)


_STATE_A_DDL = "_sp int, _b int, _t int, _k binary, _v binary, _topic string, _part int, _off long"


def _timed(fn: Callable[..., Iterator[Any]], acc: Any, spec: tasks.Spec, *args: Any) -> Iterator[Any]:
    """Run a stage A generator, adding the ``_sp`` column, and its CPU time (the Python
    worker's, so neither waits for the JVM nor CPU contention count) to ``acc``."""
    import pyarrow as pa

    batches = args[-1]
    head = args[:-1]
    sp_keys = spec.extra["sp_keys"]
    n = len(sp_keys)
    import numpy as np

    lookup = np.asarray(sp_keys, dtype=np.int32)
    spent = 0.0
    gen = fn(spec, *head, batches)
    while True:
        t0 = time.process_time()
        try:
            batch = next(gen)
        except StopIteration:
            break
        b = batch.column(0).to_numpy()
        sp = pa.array(lookup[b % n], pa.int32())
        out = pa.RecordBatch.from_arrays([sp, *batch.columns], names=["_sp", *batch.schema.names])
        spent += time.process_time() - t0
        yield out
    if acc is not None:
        acc.add(spent)


# --------------------------------------------------------------------------- mode 2


def backfill_replay(
    app: App | str,
    df: "DataFrame",
    *,
    spark: "SparkSession | None" = None,
    topic: str | None = None,
    key_col: str = "key",
    value_col: str | Sequence[str] = "value",
    key_encoded: bool = False,
    value_encoded: bool = False,
    order_by: str | Sequence[str] | None = None,
    timestamp_col: str | None = None,
    partition_col: str | None = None,
    offset_col: str | None = None,
    positions: Any = None,
    from_start: bool = False,
    tables: Sequence[str] | None = None,
    p0: int | None = None,
    processors: int | None = None,
    broker: str | None = None,
    state_dir: str | Path | None = None,
    layout_epochs: Mapping[str, int] | None = None,
    topic_partitions: Mapping[str, int | tuple[int, int]] | None = None,
    allow_partial: bool = False,
    allow_timers: bool = False,
    num_partitions: int | None = None,
    subs: int | None = None,
    keep_backup: bool = False,
    reporter: Reporter | None = None,
    fail_at: str | None = None,
) -> BackfillResult:
    """Mode 2: run the app's own handlers of ``topic`` over historical records.

    ``df`` has one row per input record: key and value (decoded forms, encoded with
    the topic's serdes, or the record's bytes with ``key_encoded`` / ``value_encoded``),
    an ordering (``order_by``, default the offset column), and where known the
    partition, offset (resume positions: highest offset + 1 per partition) and
    timestamp (ms or a timestamp column; what ``ctx.timestamp`` and windowed tables
    see). Records are grouped by key (each key's state is built by one task), ordered,
    and replayed with :class:`streamkit.replay.Replayer`: no output is sent, and a
    handler that touches another key's state is refused with ``ReplayError``. Apps with
    per-processor timers are refused unless ``allow_timers`` (timers do not run here);
    rebalance callbacks do not run either (they move state, they should not make it).
    """
    F = require("pyspark.sql.functions")
    app_obj, app_ref = _resolve_app(app)
    inputs = app_obj.input_topics
    if topic is None:
        if len(inputs) != 1:
            raise ConfigError(f"app {app_obj.name!r} consumes {inputs}: say which topic the history is of (topic=)")
        topic = inputs[0]
    if topic not in app_obj.handlers:
        raise ConfigError(f"app {app_obj.name!r} has no handler for topic {topic!r} (it handles {inputs})")
    names = list(tables) if tables is not None else sorted(app_obj.tables)
    if not names:
        raise ConfigError(f"app {app_obj.name!r} has no table: nothing to backfill")
    _common_checks(app_obj, names, "replay", allow_partial)
    if not allow_partial and len(inputs) > 1:
        raise ConfigError(
            f"app {app_obj.name!r} also consumes {[t for t in inputs if t != topic]}, whose history this replay "
            "does not include; pass allow_partial=True (CLI: --allow-partial) if their state may start empty"
        )
    stateful_timers = [t.fn for t in app_obj.timers if t.per_processor]
    if stateful_timers and not allow_timers:
        names = ", ".join(getattr(f, "__qualname__", repr(f)) for f in stateful_timers)
        raise ConfigError(
            f"app {app_obj.name!r} has per-processor timers ({names}) that run with its tables bound; the replay "
            "runs handlers only and cannot reproduce what timers do to state. Pass allow_timers=True "
            "(CLI: --allow-timers) if they do not change table state"
        )
    if order_by is None:
        if offset_col is None:
            raise ConfigError("give order_by (the ordering column(s) of each key's records) or offset_col")
        order_by = [offset_col]
    order = [order_by] if isinstance(order_by, str) else list(order_by)
    _check_columns(df, [key_col, *order, timestamp_col, partition_col, offset_col], "history")
    if offset_col is not None and partition_col is None:
        raise ConfigError("offset_col needs partition_col (offsets are per partition)")
    if any(app_obj.tables[n].window is not None for n in names) and timestamp_col is None:
        raise ConfigError("a windowed table needs the records' timestamps: give timestamp_col")
    p0_, p, notes = _counts(app_obj, p0, processors, broker)
    spark = _spark(spark)
    subs_, nparts = _layout(spark, p, num_partitions, subs)
    plan = _Plan(
        app=app_obj, mode="replay", tables=names, p0=p0_, p=p, subs=subs_, num_partitions=nparts,
        state_dir=Path(state_dir or app_obj.settings.state_dir).absolute(),
        positions=parse_positions(positions), derive_positions=offset_col is not None,
        topics=[topic], layout_epochs=dict(layout_epochs or {}),
        allow_partial=allow_partial, from_start=from_start, fail_at=fail_at, keep_backup=keep_backup,
        topic_partitions=_layouts(topic_partitions), notes=notes,
    )
    if not plan.positions and offset_col is None and not from_start:
        raise ConfigError(
            "no resume positions: give positions (TOPIC:PARTITION=NEXT_OFFSET) or the offset column of the "
            "history (offset_col + partition_col), or from_start=True if none of the history is in Kafka"
        )
    sel = [F.col(key_col).alias("key"), _value_expr(F, value_col).alias("value")]
    if timestamp_col:
        sel.append(F.col(timestamp_col).alias("ts"))
    if partition_col:
        sel.append(F.col(partition_col).cast("int").alias("partition"))
    if offset_col:
        sel.append(F.col(offset_col).cast("long").alias("offset"))
    for i, c in enumerate(order):
        sel.append(F.col(c).alias(f"o{i}"))
    normalized = df.select(*sel)
    order_types = [normalized.schema[f"o{i}"].dataType.simpleString() for i in range(len(order))]
    t = app_obj.topics[topic]
    app_pickle = None
    if app_ref is None:
        from pyspark import cloudpickle

        app_pickle = cloudpickle.dumps(app_obj)
    large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
    from streamkit.spark.session import worker_pythonpath

    codecs = tuple(tasks.TableCodec(n, app_obj.tables[n].key_serde, app_obj.tables[n].value_serde) for n in names)
    ddl = _REPLAY_A_DDL + "".join(f", _o{i} {ty}" for i, ty in enumerate(order_types))

    def build(staging: Staging, subs: int, n: int, sp_keys: list[int], acc: Any) -> "DataFrame":
        spec = tasks.Spec(
            mode="replay", p0=p0_, p=p, subs=subs, sst_root=str(staging.sst_root), large_binary=large,
            key_col="key", value_col="value", topic=topic,
            partition_col="partition" if partition_col else None,
            offset_col="offset" if offset_col else None,
            timestamp_col="ts" if timestamp_col else None,
            order_cols=tuple(f"o{i}" for i in range(len(order))),
            tables=codecs, app_ref=app_ref, app_pickle=app_pickle,
            sys_path=tuple(worker_pythonpath().split(":")),
            key_serde=RawSerde() if key_encoded else t.key_serde,
            value_serde=RawSerde() if value_encoded else t.value_serde,
            fail_at=fail_at, extra={"sp_keys": sp_keys},
        )
        placed = normalized.mapInArrow(functools.partial(_timed, tasks.place_replay, acc, spec), ddl)
        return (
            placed.repartition(n, "_sp")
            .withColumn("_h", F.xxhash64("_k"))  # a long to sort on first: Spark's prefix sort
            .sortWithinPartitions("_h", "_k", *[f"_o{i}" for i in range(len(order))], "_part", "_off", "_v")
            .drop("_sp", "_h")
            .mapInArrow(functools.partial(tasks.write_replay, spec), tasks.META_DDL)
        )

    return _run(plan, spark, build, reporter or Reporter())


_REPLAY_A_DDL = "_sp int, _b int, _k binary, _v binary, _ts long, _topic string, _part int, _off long"
