"""Pathway peer contender: per-key count and sum of `amount` with groupby().reduce(), persistence on.

    python -m benchmarks.contenders.pathway_app --bootstrap B --topic T --records N \
        --partitions P --workdir DIR --session-timeout-ms MS [--timeout S]

(Named pathway_app so that it does not shadow the `pathway` package.) Pathway's pins
conflict with the project's, so the harness runs this module with the python of a venv
of its own (``.bench/venv-pathway``, made on first use; see ``VENVS`` in
``benchmarks.contenders``): it imports only pathway, orjson and the standard library.

Graph: Kafka (format "raw": the message key and value as bytes) -> select (key, amount:
a UDF decodes the value with orjson) -> groupby(key).reduce(count, sum) -> reduce to the
totals (keys, count, sum) -> subscribe. Pathway's JSON format cannot be used: it parses
the message key as JSON too, and the input's keys (b"key-1") are not JSON.
Configuration: Pathway defaults everywhere except
  persistence on (``pw.persistence.Config`` on a filesystem backend under --workdir,
  default mode PERSISTING: the input is snapshotted as it is read, so a restart replays
  it into the same state);
  mode="streaming" (the default): ``mode="static"`` trusts the partitions' end offsets
  (ListOffsets), which the test broker (Tansu) answers wrongly, and stops early;
  a fresh consumer group, auto.offset.reset=earliest, the harness's session timeout
  (heartbeats below a third of it);
  the UDF is declared deterministic (it is), so that Pathway does not keep every result
  to replay deletions.
  One engine thread (PATHWAY_THREADS unset), autocommit every 1,500 ms (the default: the
  reader hands what it has read to the computation at that rate).

Stopping: a streaming read never ends, so the subscriber of the totals sends this process
SIGINT once they count N records; Pathway takes it as an interrupt and shuts the engine
down, which this module expects. Times: the first record is the first call of the
decoding UDF (the first commit reaching the computation, so up to one autocommit interval
after the reader got it), the last is when the totals reach N. The check is the totals
as the engine computed them over the grouped table (Pathway keeps its state in its own
snapshot format, which has no reader outside the engine).
"""

# First: importing benchmarks.contenders takes PROCESS_START, before any heavy import.
from benchmarks.contenders import PROCESS_START, parse_args, run_peer  # noqa: F401

# isort: split
import os
import signal
import sys
import time
import uuid
from typing import Any


def _heartbeat_ms(session_timeout_ms: int) -> int:
    return max(100, min(3000, session_timeout_ms // 3))


def _run(args: Any, persist_dir: str, progress: dict[str, Any], totals: dict[str, int]) -> None:
    import orjson
    import pathway as pw

    loads = orjson.loads
    now = time.time
    n_target = args.records

    @pw.udf(deterministic=True)
    def amount(data: bytes) -> int:
        if progress["first"] is None:
            progress["first"] = now()
        return loads(data)["amount"]

    messages = pw.io.kafka.read(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": f"pathway-bench-{uuid.uuid4().hex[:10]}",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": str(args.session_timeout_ms),
            "heartbeat.interval.ms": str(_heartbeat_ms(args.session_timeout_ms)),
        },
        args.topic,
        format="raw",
        mode="streaming",
    )
    records = messages.select(key=pw.this.key, amount=amount(pw.this.data))
    counts = records.groupby(pw.this.key).reduce(
        pw.this.key, count=pw.reducers.count(), sum=pw.reducers.sum(pw.this.amount)
    )
    totals_table = counts.reduce(
        keys=pw.reducers.count(), count=pw.reducers.sum(pw.this.count), sum=pw.reducers.sum(pw.this.sum)
    )

    def on_change(key: Any, row: dict[str, Any], time: int, is_addition: bool) -> None:
        if not is_addition:
            return
        totals.update(keys=row["keys"], count=row["count"], sum=row["sum"])
        progress["n"] = row["count"]
        if row["count"] >= n_target and not progress.get("stopping"):
            progress["last"] = now()
            if row["count"] > n_target:
                progress["error"] = f"read {row['count']} records, more than the {n_target} asked for"
            progress["stopping"] = True
            os.kill(os.getpid(), signal.SIGINT)  # the engine's interrupt path: stop the run

    pw.io.subscribe(totals_table, on_change)
    persistence = pw.persistence.Config(pw.persistence.Backend.filesystem(persist_dir))
    try:
        pw.run(persistence_config=persistence)
    except KeyboardInterrupt:
        if not progress.get("stopping"):
            raise


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, prog="benchmarks.contenders.pathway_app")
    persist_dir = os.path.join(args.workdir, "pathway-persistence")
    os.makedirs(args.workdir, exist_ok=True)
    totals: dict[str, int] = {}

    def read_back() -> dict[str, int]:
        if not totals:
            raise RuntimeError("the totals never reached the subscriber")
        return dict(totals)

    return run_peer(args, "pathway", lambda progress: _run(args, persist_dir, progress, totals), read_back)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # do not wait on the engine's / librdkafka's threads at interpreter exit
