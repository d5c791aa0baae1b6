"""Bytewax peer contender: per-key count and sum of `amount` with `stateful_map`, recovery on.

    python -m benchmarks.contenders.bytewax_app --bootstrap B --topic T --records N \
        --partitions P --workdir DIR --session-timeout-ms MS [--timeout S]

(Named bytewax_app so that it does not shadow the `bytewax` package.)

Dataflow: KafkaSource -> map (key str, amount) -> stateful_map [count, sum] -> a sink that
discards (Bytewax wants at least one output step). Configuration: Bytewax defaults
everywhere except
  recovery on (``RecoveryConfig`` on one SQLite recovery partition under --workdir, made
  with ``init_db_dir`` as ``python -m bytewax.recovery DIR 1`` would); the epoch stays at
  its 10 s default, so state is snapshotted at the end of every 10 s epoch and at the end
  of the run;
  KafkaSource(tail=False): the source reads each partition from its beginning (by plain
  assignment: no consumer group, so the session timeout does not apply) and ends at the
  partition's end, so the dataflow stops by itself once it has read the whole topic,
  which holds exactly N records; its batch size (1,000) and librdkafka settings are the
  defaults;
  one worker in one process (``python -m bytewax.run``'s default), through ``cli_main``.
Values are decoded with orjson (as the raw contender does).

The check is read back from the recovery partition's snapshots (SQLite, the pickled
[count, sum] of every key at its latest epoch) after the dataflow has finished.
"""

# First: importing benchmarks.contenders takes PROCESS_START, before any heavy import.
from benchmarks.contenders import PROCESS_START, check_totals, parse_args, run_peer  # noqa: F401

# isort: split
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

STEP_ID = "count_and_sum"  # the stateful_map's step id; its snapshots are stored under it
FLOW_ID = "bytewax_bench"
STEP_PREFIX = f"{FLOW_ID}.{STEP_ID}.%"  # LIKE pattern of the step ids its snapshots carry


def read_back(db_dir: str) -> dict[str, int]:
    """Totals over every key snapshotted in the recovery partitions under ``db_dir``."""
    return check_totals(_stored_pairs(db_dir))


def _stored_pairs(db_dir: str) -> Iterator[tuple[int, int]]:
    """The latest [count, sum] snapshot of every key of the stateful_map.

    Bytewax's recovery partitions are SQLite files (``part-<i>.sqlite3``); table ``snaps``
    holds one row per (step_id, state_key, snap_epoch) with the pickled state
    (``ser_change``; NULL when the key's state was discarded). The stateful_map's rows
    are under its inner step, ``<flow>.<step>.stateful_flat_map.stateful.stateful_batch``."""
    import pickle
    import sqlite3

    names = sorted(n for n in os.listdir(db_dir) if n.endswith(".sqlite3"))
    if not names:
        raise FileNotFoundError(f"no recovery partition in {db_dir}")
    for name in names:
        db = sqlite3.connect(f"file:{os.path.join(db_dir, name)}?mode=ro", uri=True)
        try:
            rows = db.execute(
                "SELECT s.ser_change FROM snaps s JOIN ("
                " SELECT state_key, MAX(snap_epoch) AS e FROM snaps WHERE step_id LIKE ? GROUP BY state_key"
                ") l ON s.state_key = l.state_key AND s.snap_epoch = l.e WHERE s.step_id LIKE ?",
                (STEP_PREFIX, STEP_PREFIX),
            )
            for (ser,) in rows:
                if ser is not None:
                    count, total = pickle.loads(ser)
                    yield count, total
        finally:
            db.close()


def _run(args: Any, db_dir: str, progress: dict[str, Any]) -> None:
    import orjson
    from bytewax import operators as op
    from bytewax._bytewax import cli_main
    from bytewax.connectors.kafka import KafkaSource
    from bytewax.dataflow import Dataflow
    from bytewax.outputs import DynamicSink, StatelessSinkPartition
    from bytewax.recovery import RecoveryConfig, init_db_dir

    class _DiscardPartition(StatelessSinkPartition[Any]):
        def write_batch(self, items: list[Any]) -> None:
            pass

    class Discard(DynamicSink[Any]):
        """An output that drops what it is given: Bytewax wants at least one output."""

        def build(self, step_id: str, worker_index: int, worker_count: int) -> _DiscardPartition:
            return _DiscardPartition()

    if not os.path.isdir(db_dir):  # a first run: make the recovery partition (a restart resumes from it)
        os.makedirs(db_dir)
        init_db_dir(db_dir, 1)

    loads = orjson.loads
    n_target = args.records
    now = time.time

    def key_and_amount(msg: Any) -> tuple[str, int]:
        return msg.key.decode(), loads(msg.value)["amount"]

    def count_and_sum(cs: list[int] | None, amount: int) -> tuple[list[int], None]:
        n = progress["n"] + 1
        progress["n"] = n
        if n == 1:
            progress["first"] = now()
        if n == n_target:
            progress["last"] = now()
        if cs is None:
            return [1, amount], None
        cs[0] += 1
        cs[1] += amount
        return cs, None

    flow = Dataflow(FLOW_ID)
    messages = op.input("kafka_in", flow, KafkaSource([args.bootstrap], [args.topic], tail=False))
    keyed = op.map("key_and_amount", messages, key_and_amount)
    counts = op.stateful_map(STEP_ID, keyed, count_and_sum)
    op.output("discard", counts, Discard())

    cli_main(flow, workers_per_process=1, recovery_config=RecoveryConfig(db_dir))
    if progress["n"] > n_target:
        progress["error"] = f"read {progress['n']} records, more than the {n_target} asked for"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, prog="benchmarks.contenders.bytewax_app")
    db_dir = os.path.join(args.workdir, "bytewax-recovery")
    return run_peer(
        args, "bytewax", lambda progress: _run(args, db_dir, progress), lambda: read_back(db_dir), stopper="dataflow"
    )


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # do not wait on librdkafka / leftover threads at interpreter exit
