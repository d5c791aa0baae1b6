"""faust-streaming peer contender: per-key count and sum of `amount` in a RocksDB table.

    python -m benchmarks.contenders.faust_app --bootstrap B --topic T --records N \
        --partitions P --workdir DIR --session-timeout-ms MS [--timeout S]

(Named faust_app so that it does not shadow the `faust` package.)

Configuration: faust-streaming defaults everywhere except
  store="rocksdb://" (the RocksDB table store, via rocksdict), processing_guarantee=
  "at_least_once" (its exactly-once uses Kafka transactions, unsupported by the test
  broker; this is also faust's default), consumer_auto_offset_reset="earliest", a fresh
  app id (= consumer group) and data dir per run, the harness's session timeout,
  topic_partitions=P (the table's changelog is co-partitioned with the input),
  web_enabled=False (no HTTP port to collide with), and logging at WARNING with the
  terminal spinner off: faust's worker otherwise sets the root logger to DEBUG so that
  the spinner turns on every log record, which costs a fair run a lot.
  commit_interval stays at its 2.8 s default, changelog on, one agent (concurrency 1).

The agent asks the worker to stop (the same path as SIGTERM: a graceful stop that commits
offsets and closes the tables) when N records have been processed. The check is read back
from the table's RocksDB partitions on disk after the worker has closed them.
"""

# First: importing benchmarks.contenders takes PROCESS_START, before any heavy import.
from benchmarks.contenders import PROCESS_START, check_totals, parse_args, run_peer  # noqa: F401

# isort: split
import json
import logging
import os
import sys
import time
import uuid

TABLE_NAME = "counts"


def read_back(tabledir: str) -> dict:
    """Totals over every key of the table's RocksDB partitions (<tabledir>/counts-<p>.db).

    Keys are the raw message keys, values the JSON [count, sum]; faust keeps its
    changelog offset in the same DB under b"__faust\\0offset__", which is skipped.
    """
    if not os.path.isdir(tabledir):
        raise FileNotFoundError(tabledir)
    return check_totals(_stored_pairs(tabledir))


def _stored_pairs(tabledir: str):
    """The [count, sum] of every key of the table's partitions (see read_back)."""
    from rocksdict import AccessType, Options, Rdict

    for name in sorted(os.listdir(tabledir)):
        if not (name.startswith(TABLE_NAME + "-") and name.endswith(".db")):
            continue
        db = Rdict(os.path.join(tabledir, name), options=Options(raw_mode=True), access_type=AccessType.read_only())
        try:
            for k, v in db.items():
                if not k.startswith(b"__faust"):
                    yield json.loads(v)
        finally:
            db.close()


def _run(args, app_id: str, datadir: str, progress: dict) -> str:
    import signal

    import faust

    app = faust.App(
        app_id,
        broker=f"kafka://{args.bootstrap}",
        store="rocksdb://",
        datadir=datadir,
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=args.session_timeout_ms / 1000.0,
        # the default heartbeat (3 s) must stay below a third of the session timeout, or
        # a short session (a first join on the test broker waits session/2) expires.
        broker_heartbeat_interval=max(0.1, min(3.0, args.session_timeout_ms / 3000.0)),
        topic_partitions=args.partitions,
        web_enabled=False,
    )
    topic = app.topic(args.topic, key_type=bytes, value_serializer="json", partitions=args.partitions)
    table = app.Table(TABLE_NAME, default=None, partitions=args.partitions, key_type=bytes)

    n_target = args.records
    now = time.time
    worker_box = {}

    @app.agent(topic)
    async def count_and_sum(stream):
        try:
            async for key, value in stream.items():
                n = progress["n"]
                if n >= n_target:  # more records than asked for: leave them alone
                    continue
                cs = table.get(key)
                if cs is None:
                    table[key] = [1, value["amount"]]
                else:
                    table[key] = [cs[0] + 1, cs[1] + value["amount"]]
                n += 1
                progress["n"] = n
                if n == 1:
                    progress["first"] = now()
                if n == n_target:
                    progress["last"] = now()
                    # The graceful path SIGTERM takes: stop the worker (commit, close tables).
                    worker_box["worker"]._schedule_shutdown(signal.SIGTERM)
        except Exception as exc:  # a crashed agent would leave the worker idling forever
            progress["error"] = f"agent crashed: {type(exc).__name__}: {exc}"
            worker_box["worker"]._schedule_shutdown(signal.SIGTERM)
            raise

    worker = faust.Worker(app, loglevel="WARNING", quiet=True, redirect_stdouts=False)
    # faust's worker sets the root logger to DEBUG so that its terminal spinner turns on
    # every log record (a large cost while processing): no spinner, no DEBUG root.
    worker.spinner = None
    worker_box["worker"] = worker
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise RuntimeError(f"faust worker exited with {exc.code}") from None
    return str(app.conf.tabledir)


def main(argv=None) -> int:
    args = parse_args(argv, prog="benchmarks.contenders.faust_app")
    run_id = uuid.uuid4().hex[:10]
    app_id = f"faust-bench-{run_id}"
    datadir = os.path.join(args.workdir, f"faust-data-{run_id}")
    os.makedirs(datadir, exist_ok=True)
    tabledir: dict[str, str] = {}

    def run(progress: dict) -> None:
        tabledir["path"] = _run(args, app_id, datadir, progress)

    def check() -> dict:
        return read_back(tabledir.get("path") or os.path.join(datadir, f"{app_id}-data", "v1", "tables"))

    return run_peer(args, "faust", run, check, stopper="worker")


if __name__ == "__main__":
    logging.getLogger().setLevel(logging.WARNING)
    code = main()
    sys.stdout.flush()
    os._exit(code)  # do not wait on leftover threads at interpreter exit
