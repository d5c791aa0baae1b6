"""quixstreams peer contender with hopping windows: per key, count and sum of `amount`
in windows of 10 s hopping by 1 s (grace 0) over the records' Kafka timestamps, final
results only (``.final()``, nothing produced), as ``streamkit-hopping`` does.

    python -m benchmarks.contenders.quix_hopping --bootstrap B --topic T --records N \
        --partitions P --workdir DIR --session-timeout-ms MS [--timeout S]

Configured as the ``quix`` contender (at-least-once, defaults elsewhere, changelog on).
A first step counts the records and stops the app at N; ``check`` is omitted.
"""

# First: importing benchmarks.contenders takes PROCESS_START, before any heavy import.
from benchmarks.contenders import PROCESS_START, parse_args, run_peer  # noqa: F401

# isort: split
import os
import sys
import time
import uuid

from benchmarks.contenders.quix import application


def _run(args, state_dir: str, progress: dict) -> None:
    app, topic = application(args, state_dir, f"quix-hopping-{uuid.uuid4().hex[:10]}")
    sdf = app.dataframe(topic)
    n_target, stop, now = args.records, app.stop, time.time

    def count(value) -> None:  # first: the record counts once, whatever windows it joins
        n = progress["n"]
        if n < n_target:
            progress["n"] = n = n + 1
            if n == 1:
                progress["first"] = now()
            if n == n_target:
                progress["last"] = now()
                stop()

    sdf = sdf.update(count)
    sdf = (
        sdf.hopping_window(duration_ms=10_000, step_ms=1_000, grace_ms=0)
        .reduce(reducer=lambda acc, v: [acc[0] + 1, acc[1] + v["amount"]], initializer=lambda v: [1, v["amount"]])
        .final()
    )
    app.run()


def main(argv=None) -> int:
    args = parse_args(argv, prog="benchmarks.contenders.quix_hopping")
    state_dir = os.path.join(args.workdir, f"quix-state-{uuid.uuid4().hex[:10]}")
    os.makedirs(args.workdir, exist_ok=True)
    return run_peer(args, "quix-hopping", lambda progress: _run(args, state_dir, progress), lambda: {})


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
