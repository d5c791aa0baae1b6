import time

PROCESS_START = time.time()  # first statement: taken before any heavy import

"""streamkit contender: per-key count and sum of `amount` in RocksDB state, checkpointing on.

    python -m benchmarks.contenders.streamkit_app --bootstrap B --topic T --records N \
        --partitions P --workdir DIR --session-timeout-ms MS

One worker process hosting every processor (p0 = the partition count), default settings
(checkpoint every 2 s: state changes + positions in one RocksDB batch, then the Kafka
offset commit). The handler stops the worker when N records have been handled; the check
is read back from the processors' RocksDB stores after the worker has closed them.
"""

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import orjson  # noqa: E402

import streamkit  # noqa: E402
from stores.rocksdb import RocksDBStore  # noqa: E402
from streamkit.runtime.worker import Worker  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(prog="benchmarks.contenders.streamkit_app")
    for flag in ("--bootstrap", "--topic", "--workdir"):
        ap.add_argument(flag, required=True)
    for flag in ("--records", "--partitions", "--session-timeout-ms"):
        ap.add_argument(flag, type=int, required=True)
    a = ap.parse_args()

    app = streamkit.App(
        f"bench-{uuid.uuid4().hex[:8]}", broker=a.bootstrap, state_dir=Path(a.workdir) / "state",
        session_timeout_ms=a.session_timeout_ms,
    )
    source = app.topic(a.topic, key_serde="raw")
    stats = app.table("stats", key_serde="raw", default=lambda: [0, 0])
    progress = {"n": 0, "first": 0.0, "last": 0.0}
    target = a.records
    worker = Worker(app, 1)

    @app.processor(source)
    def count_and_sum(key: bytes, value: Any, ctx: streamkit.Context) -> None:
        s = stats[key]
        stats[key] = [s[0] + 1, s[1] + value["amount"]]
        n = progress["n"] = progress["n"] + 1
        if n == 1:
            progress["first"] = time.time()
        elif n == target:
            progress["last"] = time.time()
            worker.stop()

    asyncio.run(worker.run())
    keys = count = total = 0
    for pid in range(a.partitions):
        store = RocksDBStore.open(str(app.store_path(pid)), ["stats"])
        for _, v in store.items("stats"):
            c, s = orjson.loads(v)
            keys, count, total = keys + 1, count + c, total + s
        store.close()
    result = {
        "records": progress["n"], "first_record_at": progress["first"],
        "last_record_at": progress["last"], "process_start": PROCESS_START,
        "check": {"keys": keys, "count": count, "sum": total},
    }
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
