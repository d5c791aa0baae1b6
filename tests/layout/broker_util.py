"""Helpers of the layout tests on the real broker: read a topic, deliver it as a gated
consumer would, find misordered records, run a producer in another process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from streamkit.kafkaio import FetchedRecord, KafkaIO
from streamkit.layout.gating import compute_gate
from streamkit.layout.model import TopicLayout

HERE = Path(__file__).parent


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def read_partitions(bootstrap: str, layout: TopicLayout) -> dict[int, list[FetchedRecord]]:
    async with KafkaIO(bootstrap) as io:
        return {p: (await io.read(layout.topic, p, 0))[0] for p in range(layout.physical)}


def deliver(layout: TopicLayout, recs: dict[int, list[FetchedRecord]], *, gated: bool = True) -> list[FetchedRecord]:
    """An adversarial single consumer: it always delivers the next record of the
    highest-index partition whose gate allows one (new partitions as early as
    possible); the group position is its own position (committed at once)."""
    readable = sorted(layout.readable, reverse=True)
    idx = {p: 0 for p in readable}
    pos = {p: layout.base_offset(p) for p in readable}
    out: list[FetchedRecord] = []
    for p in readable:  # skip leftovers of earlier incarnations
        lst = recs.get(p, [])
        while idx[p] < len(lst) and lst[idx[p]].offset < pos[p]:
            idx[p] += 1
    while True:
        gate = compute_gate(layout, readable, pos)
        for p in readable:
            lst = recs.get(p, [])
            if idx[p] >= len(lst):
                continue
            r = lst[idx[p]]
            lim = gate.gates[p].limit
            if gated and lim is not None and r.offset >= lim:
                continue
            out.append(r)
            pos[p] = r.offset + 1
            idx[p] += 1
            break
        else:
            left = sum(len(recs.get(p, [])) - idx[p] for p in readable)
            assert left == 0, f"gated delivery stuck with {left} records left"
            return out


def misordered(records: Sequence[FetchedRecord]) -> list[FetchedRecord]:
    """Records delivered after a record of the same producer and key with a higher seq."""
    last: dict[tuple[str, str], int] = {}
    bad = []
    for r in records:
        v = orjson.loads(r.value)
        k = (v["p"], v["k"])
        if v["seq"] <= last.get(k, 0):
            bad.append(r)
        last[k] = max(last.get(k, 0), v["seq"])
    return bad


class Proc:
    """A producer_proc.py child process (only processes this test started are signalled)."""

    def __init__(self, broker: str, topic: str, name_: str, tmp: Path, **opts: Any) -> None:
        self.out = tmp / f"{name_}.json"
        self.stop_file = tmp / f"{name_}.stop"
        args = [
            sys.executable,
            str(HERE / "producer_proc.py"),
            broker,
            topic,
            name_,
            str(self.out),
            "--stop-file",
            str(self.stop_file),
        ]
        for k, v in opts.items():
            args += [f"--{k.replace('_', '-')}", str(v)]
        env = dict(os.environ, PYTHONPATH=str(HERE.parents[1]))
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("ready"):
            self.proc.kill()
            raise AssertionError(f"producer {name_} did not start: {line!r} {self.proc.stderr.read()}")
        self.producer_id = line.split()[1]

    def finish(self, timeout: float = 30.0) -> dict[str, Any]:
        self.stop_file.touch()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        assert self.proc.returncode == 0, self.proc.stderr.read()
        return orjson.loads(self.out.read_bytes())

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()
