"""The job of the latency benchmark, for streamkit and for quixstreams: count per key
(state), and one output record per input record carrying the producer's send time and
the time the handler was called.

    python -m benchmarks.latency_app streamkit|quix|client BOOTSTRAP INPUT OUTPUT STATE_DIR low|throughput

streamkit runs as ``streamkit worker`` would (its ``latency`` setting from the last
argument); quixstreams with its defaults, or, for ``low``, its consumer's fetch wait and
its producer's linger set as streamkit's low-latency preset sets them.
"""

from __future__ import annotations

import sys
import time
from typing import Any


def run_streamkit(bootstrap: str, topic: str, out: str, state_dir: str, latency: str) -> None:
    import asyncio

    import streamkit
    from streamkit.runtime.worker import Worker

    app = streamkit.App(f"latency-{latency}", broker=bootstrap, state_dir=state_dir, latency=latency, processors=4)
    counts = app.table("counts", default=int)

    @app.processor(app.topic(topic))
    def count(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        handled = time.time()
        counts[key] += 1
        ctx.send(out, key, {"sent": value["sent"], "handled": handled, "m": value["m"]})

    asyncio.run(Worker(app, 1).run())


def run_quix(bootstrap: str, topic: str, out: str, state_dir: str, latency: str) -> None:
    import logging

    from quixstreams import Application

    low = latency == "low"
    app = Application(
        broker_address=bootstrap,
        consumer_group=f"quix-latency-{int(time.time() * 1000)}",
        auto_offset_reset="earliest",
        processing_guarantee="at-least-once",
        state_dir=state_dir,
        consumer_extra_config={"fetch.wait.max.ms": 5} if low else {},
        producer_extra_config={"linger.ms": 0} if low else {},
        loglevel=logging.WARNING,
    )
    source = app.topic(topic, key_deserializer="str", value_deserializer="json")
    source.broker_config.extra_config.update({"retention.ms": "-1", "retention.bytes": "-1"})  # see contenders/quix
    sink = app.topic(out, key_serializer="str", value_serializer="json")
    sink.broker_config.extra_config.update({"retention.ms": "-1", "retention.bytes": "-1"})

    def count(value: dict[str, Any], state: Any) -> dict[str, Any]:
        handled = time.time()
        state.set("n", (state.get("n") or 0) + 1)
        return {"sent": value["sent"], "handled": handled, "m": value["m"]}

    app.dataframe(source).apply(count, stateful=True).to_topic(sink)
    app.run()


def run_client(bootstrap: str, topic: str, out: str, state_dir: str, latency: str) -> None:
    """The plain client as a job of its own: a consumer group member reading the input
    (fetch wait 5 ms at ``low``, 500 at ``throughput``) and a producer (linger 0 or 5 ms)
    sending one output per record, counts in a dict. What any job in its own process pays
    before the framework's code: streamkit's and quixstreams' figures less this one are
    theirs."""
    import asyncio

    import orjson
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    low = latency == "low"

    async def main() -> None:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=f"client-latency-{out}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_wait_ms=5 if low else 500,
        )
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0 if low else 5)
        await consumer.start()
        await producer.start()
        counts: dict[bytes, int] = {}
        while True:
            batch = await consumer.getmany(timeout_ms=200, max_records=1_000)
            for records in batch.values():
                for rec in records:
                    handled = time.time()
                    value = orjson.loads(rec.value)
                    counts[rec.key] = counts.get(rec.key, 0) + 1
                    reply = {"sent": value["sent"], "handled": handled, "m": value["m"]}
                    await producer.send(out, orjson.dumps(reply), key=rec.key)

    asyncio.run(main())


if __name__ == "__main__":
    contender, *args = sys.argv[1:]
    {"streamkit": run_streamkit, "quix": run_quix, "client": run_client}[contender](*args)
