"""raw contender: aiokafka ``getmany`` + orjson decode of every value, no other work.
``raw-dict`` (``BENCH_CONTENDER``): the same, and the job's state kept in a plain dict
(each key's count and sum of ``amount``, as streamkit's contender keeps them in its
table), nothing persisted: what any Python job that holds per-key state pays, before a
store, a changelog or a checkpoint.

    python -m benchmarks.contenders.raw --bootstrap B --topic T --records N \\
        --partitions P --workdir DIR --session-timeout-ms MS

The client's limit: how fast one Python process can pull the input through aiokafka
and decode it. No consumer group (the partitions are assigned directly, so there is no
join to wait for), no commits, no state. The only work besides decoding is what the
check needs: the sum of ``amount`` and the set of keys.

Fetch sizes: 4 MiB per partition (aiokafka's default is 1 MiB), 64 MiB per request:
fewer, larger fetches. On a loaded machine 1/4/8/16 MiB made no difference beyond the
noise (about 2.0-2.3 us CPU per record each); revisit on a quiet one. CRC checks stay
on (aiokafka's default).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from benchmarks.contenders import PROCESS_START, emit_result, parse_args

MAX_PARTITION_FETCH_BYTES = 4 << 20
FETCH_MAX_BYTES = 64 << 20


async def run(args) -> dict:
    import orjson
    from aiokafka import AIOKafkaConsumer, TopicPartition

    loads = orjson.loads
    consumer = AIOKafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES,
        fetch_max_bytes=FETCH_MAX_BYTES,
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(args.topic, p) for p in range(args.partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        target = args.records
        n = 0
        total = 0
        keys: set[bytes] = set()
        state: dict[bytes, list[int]] | None = {} if os.environ.get("BENCH_CONTENDER") == "raw-dict" else None
        first = last = None
        while n < target:
            batches = await consumer.getmany(timeout_ms=1000)
            for msgs in batches.values():
                if not msgs:
                    continue
                if first is None:
                    first = time.time()
                if n + len(msgs) > target:
                    msgs = msgs[: target - n]
                if state is None:
                    for m in msgs:
                        total += loads(m.value)["amount"]
                        keys.add(m.key)
                else:
                    for m in msgs:
                        amount = loads(m.value)["amount"]
                        total += amount
                        s = state.get(m.key)
                        state[m.key] = [1, amount] if s is None else [s[0] + 1, s[1] + amount]
                n += len(msgs)
                if n >= target:
                    break
        last = time.time()
        return {
            "records": n,
            "first_record_at": first,
            "last_record_at": last,
            "check": {"keys": len(keys) if state is None else len(state), "count": n, "sum": total},
        }
    finally:
        await consumer.stop()


def main() -> int:
    args = parse_args(prog="benchmarks.contenders.raw")
    try:
        result = asyncio.run(run(args))
    except Exception as exc:  # report, do not hang the harness
        emit_result(
            records=0,
            first_record_at=None,
            last_record_at=None,
            process_start=PROCESS_START,
            error=f"{type(exc).__name__}: {exc}",
            contender="raw",
        )
        return 1
    emit_result(process_start=PROCESS_START, contender="raw", **result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
