"""A producer process for the layout tests: keyed records with per-key sequence numbers.

    python producer_proc.py BOOTSTRAP TOPIC NAME OUT.json --keys 40 --rate 2000 --stop-file F
        [--lease-ms 3000 --heartbeat-ms 1000]

Prints ``ready`` once started (heartbeat written, layouts read), sends ``{"p": NAME,
"k": key, "seq": n}`` until the stop file exists, flushes, and writes its stats and the
fences it saw to OUT.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import orjson

from streamkit.producer import Producer, ProducerConfig


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    ap.add_argument("name")
    ap.add_argument("out")
    ap.add_argument("--keys", type=int, default=40)
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--stop-file", required=True)
    ap.add_argument("--lease-ms", type=int, default=3000)
    ap.add_argument("--heartbeat-ms", type=int, default=1000)
    a = ap.parse_args()
    seq: dict[str, int] = {}
    async with Producer(
        a.bootstrap,
        client_id=a.name,
        config=ProducerConfig(lease_ms=a.lease_ms, heartbeat_ms=a.heartbeat_ms, linger_ms=2),
    ) as p:
        print("ready", p.producer_id, flush=True)
        start = time.monotonic()
        n = 0
        while not os.path.exists(a.stop_file):
            key = f"{a.name}-k{n % a.keys}"
            seq[key] = seq.get(key, 0) + 1
            await p.send(a.topic, key, {"p": a.name, "k": key, "seq": seq[key]})
            n += 1
            ahead = n / a.rate - (time.monotonic() - start)
            if ahead > 0:
                await asyncio.sleep(ahead)
        await p.flush()
        out = {
            "producer_id": p.producer_id,
            "sent": n,
            "stats": p.stats,
            "fences": [[f.topic, f.epoch] for f in p.fences],
            "epoch": p.epoch(a.topic),
        }
    with open(a.out, "wb") as f:
        f.write(orjson.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
