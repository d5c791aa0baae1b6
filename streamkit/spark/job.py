"""Running a backfill's Spark job on the driver, then building and publishing the stores:
the part both modes share after their DataFrame is built."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stores.base import Checkpoint
from streamkit.errors import ReplayError
from streamkit.spark import tasks
from streamkit.spark.backfill_plan import BackfillPlan
from streamkit.spark.keyless import KeylessTally, refuse_or_count
from streamkit.spark.positions import _final_positions, _stamp
from streamkit.spark.result import BackfillResult, Reporter
from streamkit.spark.shuffle import TaskCounters, spark_partition_keys
from streamkit.spark.staging import BackfillError, InjectedFailure, Staging, check_fail
from streamkit.state.changelog import changelog_topic
from streamkit.state.seed import log_stores
from streamkit.windows import STREAM_TIME_KEY

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


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


def _run(
    plan: BackfillPlan,
    spark: SparkSession,
    build: Callable[[Staging, int, int, list[int], Any], DataFrame],
    reporter: Reporter,
) -> BackfillResult:
    t_start = time.perf_counter()
    app = plan.app
    app_dir = plan.state_dir / app.name
    warnings: list[str] = list(plan.notes)
    with Staging(app_dir, fail_at=plan.fail_at, keep_backup=plan.keep_backup) as staging:
        if staging.recovered:
            warnings.append("rolled back a publish that an earlier backfill left unfinished")
        staging.check_live_unlocked(range(plan.first, plan.p), below=plan.first)
        staging.prepare_sst_dirs(range(plan.p), plan.tables)
        sc = spark.sparkContext
        counters = TaskCounters(sc.accumulator(0.0), sc.accumulator({}, KeylessTally()))  # type: ignore[arg-type]
        group = f"streamkit-backfill-{staging.run_id}"
        sc.setJobGroup(group, f"streamkit backfill of {app.name} ({plan.mode})", interruptOnCancel=True)
        old_batch = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "65536")
        try:
            with reporter.phase("spark", "encode, place, shuffle, sort, write SST files"):
                df = build(staging, plan.subs, plan.num_partitions, spark_partition_keys(plan.num_partitions), counters)
                reporter.spark_job(spark, group)
                ok = False
                # stage A may have run in a job of the build's own (windows' stream times), over
                # partitions this job may split otherwise: only this job's counts stand
                counters.keyless.value = {}
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
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", old_batch)  # type: ignore[arg-type]
            sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]  # None clears it
            sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
        rows_in, keyless = refuse_or_count(counters.keyless.value, plan.keyless_inputs, plan.allow_skipped)
        plan.rows_in += rows_in
        if keyless:
            plan.left_out["rows without a key"] = plan.left_out.get("rows without a key", 0) + keyless
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
        dups = nulls = handler_errors = skipped = late = 0
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
                    elif k == "late":
                        late += int(v)
                if rest:
                    infos.extend(rest.splitlines())
            elif r.kind == "timing" and r.info == "replay":
                replay_s += r.seconds or 0.0
            elif r.kind == "timing" and r.info == "input_wait":
                wait_s += r.seconds or 0.0
            elif r.kind == "timing" and r.info == "stage_a":
                fused_a += r.seconds or 0.0
        left_out = dict(plan.left_out)
        if handler_errors:
            left_out["rejected by a handler"] = handler_errors
        if skipped:
            left_out["undecodable"] = skipped
        if (handler_errors or skipped) and not plan.allow_skipped:
            raise BackfillError(
                f"{handler_errors:,} history row(s) were rejected by a handler and {skipped:,} could not be "
                f"decoded, e.g. {'; '.join(infos[:3])}; the stores are untouched. Fix the history, or pass "
                "allow_skipped=True to leave them out (as a worker sends such records to the dead letters)"
            )
        if left_out:
            warnings.append(
                "left out: " + ", ".join(f"{n:,} {why}" for why, n in left_out.items()) + " (allow_skipped)"
            )
        if late:  # what a worker sends to the dead letters (reason "late"): not a failure
            warnings.append(f"{late:,} record(s) were late for a windowed table and left out, as a worker would")

        positions = _final_positions(plan, max_off)
        per_proc, stamped_everywhere = _stamp(plan, positions, owners)
        if stamped_everywhere:
            warnings.append(
                f"no partition data for {sorted(stamped_everywhere)}: their positions are stamped into every "
                "store (give the partition column or topic_partitions to stamp only their owners)"
            )

        # -- stores --------------------------------------------------------------------------
        extra: dict[str, Any] = {
            "backfill": {"mode": plan.mode, "tables": sorted(plan.tables), "p0": plan.p0, "processors": plan.p}
        }
        if plan.incarnation:
            extra["incarnation"] = plan.incarnation
        all_tables = sorted(app.tables)
        with reporter.phase("build", f"ingest SST files into {plan.p - plan.first} fresh store(s)"):
            for proc in range(plan.first, plan.p):
                files = {t: sorted(fs) for t, fs in ssts[proc].items()}
                mine = {**extra, STREAM_TIME_KEY: plan.stream_times[proc]} if proc in plan.stream_times else extra
                checkpoint = Checkpoint(positions=per_proc[proc], layout_epochs=dict(plan.layout_epochs), extra=mine)
                path = staging.build_store(proc, all_tables, files, checkpoint)
                if plan.verify_unique:
                    _verify_unique(path, files, ssts_keys[proc])
                if proc == plan.first:
                    check_fail("build", plan.fail_at)
        with reporter.phase("publish", "swap the new stores in atomically"):
            published = staging.publish(plan.p, first=plan.first)
        if plan.cluster is not None and app.settings.changelog:  # each store held while it goes in
            with reporter.phase("changelog", "write the new stores to the job's changelog"):
                live = {proc: plan.state_dir / app.name / f"processor-{proc}" for proc in range(plan.first, plan.p)}
                asyncio.run(
                    log_stores(plan.cluster.connection, changelog_topic(app.name), live,
                               processors=plan.p, create=app.settings.changelog_partitions)
                )  # fmt: skip
    seconds = time.perf_counter() - t_start
    timings = dict(reporter.timings)
    timings["tasks_stage_a_cpu"] = float(counters.cpu.value) + fused_a
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
        rows_read=plan.rows_in or rows_read,
        keys_written=keys_written,
        stores_published=len(published),
        store_paths=[str(p) for p in published],
        positions=dict(sorted(positions.items())),
        run_id=staging.run_id,
        seconds=seconds,
        timings=timings,
        details={
            "duplicates": dups,
            "null_values": nulls,
            "handler_errors": handler_errors,
            "late": late,
            "skipped_decode": skipped,
            "left_out": left_out,
            "buckets": plan.p * plan.subs,
            "spark_partitions": plan.num_partitions,
            "partitioned_by_key": plan.verify_unique,  # mode 1 wrote each input partition where it was
        },
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
                    "partitioned by key (pass partitioned_by_key=False)"
                )
    finally:
        store.close()
