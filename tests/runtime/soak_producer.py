"""A producer process for the soak test: shared keys, per-producer sequence numbers.

    python -m tests.runtime.soak_producer BOOTSTRAP TOPIC NAME OUT.json --keys K --rate R --stop-file F
        [--disorder-ms D --late-every L --late-ms M --seed S] [--steps T1:R1,T2:R2,...]

Record n has key f"k{n % K}" and value {"p": NAME, "seq": n}. Prints "ready PRODUCER_ID", sends until
the stop file exists, flushes, and writes {"sent": n, "fences": [...]} to OUT.json. Its timestamp is
the wall clock's, up to D ms behind it (out of order); after the first K, one record in L (at random) is M ms behind
(late), its value marked {"late": 1}. With --steps, the rate becomes R1 records/s T1 seconds after
the start, R2 at T2, ... (a step load).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import time

import orjson

from streamkit.producer import Producer, ProducerConfig


async def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("bootstrap", "topic", "name", "out"):
        ap.add_argument(name)
    ap.add_argument("--keys", type=int, default=200)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--stop-file", required=True)
    ap.add_argument("--disorder-ms", type=int, default=0)
    ap.add_argument("--late-every", type=int, default=0)
    ap.add_argument("--late-ms", type=int, default=7000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", default="", help="T:R,...: the rate R from T seconds after the start on")
    a = ap.parse_args()
    steps = sorted((float(t), float(r)) for t, r in (s.split(":") for s in a.steps.split(",") if s))
    rng = random.Random(a.seed)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    async with Producer(a.bootstrap, client_id=a.name, config=ProducerConfig(linger_ms=2)) as p:
        print("ready", p.producer_id, flush=True)
        start, n = time.monotonic(), 0
        rate, since, base = a.rate, start, 0  # (the rate of the current step, since when, records before it)
        while not os.path.exists(a.stop_file):
            while steps and time.monotonic() - start >= steps[0][0]:
                since, rate, base = start + steps[0][0], steps[0][1], n
                steps.pop(0)
            key, value = f"k{n % a.keys}", {"p": a.name, "seq": n}
            if a.disorder_ms or a.late_every:
                late = n >= a.keys and a.late_every and rng.randrange(a.late_every) == 0  # (after every key's first)
                behind = a.late_ms if late else rng.randrange(a.disorder_ms + 1)
                if late:
                    value["late"] = 1
                await p.send(a.topic, key, value, timestamp_ms=int(time.time() * 1000) - behind)
            else:
                await p.send(a.topic, key, value)
            n += 1
            ahead = (n - base) / rate - (time.monotonic() - since)
            if ahead > 0:
                await asyncio.sleep(ahead)
        await p.flush()
        fences = [[f.topic, f.epoch] for f in p.fences]
    with open(a.out, "wb") as f:
        f.write(orjson.dumps({"sent": n, "fences": fences}))


if __name__ == "__main__":
    asyncio.run(main())
