"""quixstreams peer contender: per-key count and sum of `amount` in RocksDB state.

    python -m benchmarks.contenders.quix --bootstrap B --topic T --records N \
        --partitions P --workdir DIR --session-timeout-ms MS [--timeout S]

Configuration (see the module constants): quixstreams defaults everywhere except
  processing_guarantee="at-least-once" (its exactly-once uses Kafka transactions,
  which the test broker does not support), auto_offset_reset="earliest", a fresh
  consumer group and state dir per run, and the harness's session timeout.
  commit_interval stays at its 5 s default, changelog topics stay on (default),
  RocksDB options are the defaults.

The app stops itself from inside the processing function when N records have been
processed; quixstreams then commits its final checkpoint (flushes state to RocksDB,
produces the changelog, commits offsets). The check is read back from the RocksDB
partitions on disk after the app has closed them.
"""

# First: importing benchmarks.contenders takes PROCESS_START, before any heavy import.
from benchmarks.contenders import PROCESS_START, check_totals, parse_args, run_peer  # noqa: F401

# isort: split
import json
import os
import sys
import time
import uuid

STORE_NAME = "default"
STATE_KEY = "cs"  # one state entry per message key: [count, sum]


def read_back(state_dir: str) -> dict:
    """Totals over every key stored in the app's RocksDB partitions (default column family).

    quixstreams' layout: <state_dir>/<store>/<topic>/<partition>/ holds one RocksDB per
    partition; keys are b"<message key>|<serialized state key>", values are the
    JSON-serialized state value, possibly prefixed by an 8-byte TTL stamp.
    """
    return check_totals(_stored_pairs(state_dir))


def _stored_pairs(state_dir: str):
    """The [count, sum] of every key stored under state_dir (see read_back)."""
    from rocksdict import AccessType, Options, Rdict

    suffix = b"|" + json.dumps(STATE_KEY).encode()
    for root, dirs, files in os.walk(state_dir):
        if "CURRENT" not in files:
            continue
        dirs[:] = []
        cfs = Rdict.list_cf(root)
        db = Rdict(
            root,
            options=Options(raw_mode=True),
            access_type=AccessType.read_only(),
            column_families={cf: Options(raw_mode=True) for cf in cfs if cf != "default"},
        )
        try:
            for k, v in db.items():
                if not k.endswith(suffix):
                    continue
                if not v.startswith(b"["):  # TTL-stamped value: 8-byte expiry, then JSON
                    v = v[8:]
                yield json.loads(v)
        finally:
            db.close()


def _heartbeat_ms(session_timeout_ms: int) -> int:
    return max(100, min(3000, session_timeout_ms // 3))


def application(args, state_dir: str, group: str):
    """The quixstreams app as every quix contender configures it, and its input topic."""
    import logging

    from quixstreams import Application

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        processing_guarantee="at-least-once",
        state_dir=state_dir,
        consumer_extra_config={
            "session.timeout.ms": args.session_timeout_ms,
            # librdkafka's default heartbeat (3 s) must stay below a third of the
            # session timeout, or a short session (used because a first join on the
            # test broker waits session/2) expires between two heartbeats.
            "heartbeat.interval.ms": _heartbeat_ms(args.session_timeout_ms),
        },
        loglevel=logging.WARNING,
    )
    topic = app.topic(args.topic, key_deserializer="bytes", value_deserializer="json")
    # Tansu's DescribeConfigs returns only the configs set at topic creation. quixstreams
    # derives its changelog topic's retention from the input topic's and fails with
    # KeyError: 'retention.ms' when the input was created without it. An absent
    # retention on Tansu means "keep forever" (it has no retention): say so explicitly.
    extra = topic.broker_config.extra_config
    extra.setdefault("retention.ms", "-1")
    extra.setdefault("retention.bytes", "-1")
    return app, topic


def _run(args, state_dir: str, progress: dict) -> None:
    run_id = os.path.basename(state_dir).rsplit("-", 1)[-1]
    app, topic = application(args, state_dir, f"quix-bench-{run_id}")
    sdf = app.dataframe(topic)

    n_target = args.records
    stop = app.stop
    now = time.time

    def count_and_sum(value, state) -> None:
        n = progress["n"]
        if n >= n_target:  # more records than asked for: leave them alone
            return
        cs = state.get(STATE_KEY)
        if cs is None:
            state.set(STATE_KEY, [1, value["amount"]])
        else:
            state.set(STATE_KEY, [cs[0] + 1, cs[1] + value["amount"]])
        n += 1
        progress["n"] = n
        if n == 1:
            progress["first"] = now()
        if n == n_target:
            progress["last"] = now()
            stop()

    sdf.update(count_and_sum, stateful=True)

    app.run()


def main(argv=None) -> int:
    args = parse_args(argv, prog="benchmarks.contenders.quix")
    state_dir = os.path.join(args.workdir, f"quix-state-{uuid.uuid4().hex[:10]}")
    os.makedirs(args.workdir, exist_ok=True)
    return run_peer(args, "quix", lambda progress: _run(args, state_dir, progress), lambda: read_back(state_dir))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # do not wait on librdkafka / non-daemon threads at interpreter exit
