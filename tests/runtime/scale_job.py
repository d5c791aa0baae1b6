"""Driving a scaling job in real processes: worker processes of tests/runtime/scale_app.py,
producer processes with per-key sequence numbers, `streamkit scale`; and checking the end
state and the output."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from stores.rocksdb import RocksDBStore
from streamkit.kafkaio import KafkaIO
from streamkit.runtime.jobmeta import JobLayout, read_job
from streamkit.runtime.status import STATUS_TOPIC, WorkerStatus, decode_status
from tests.runtime.jobs import ROOT
from tests.runtime.scale_windows import verify_windows

KEYS = 200


class ScaleJob:
    def __init__(
        self,
        broker: str,
        tmp_path: Path,
        p0: int = 2,
        partitions: int = 4,
        every_window: bool = False,
        own_disks: bool = False,
    ) -> None:
        """``every_window``: the job keeps a window of every kind, not only per-second ones.
        ``own_disks``: each worker keeps its stores in a state directory of its own, as on
        machines of their own (a processor that moves finds no store of it there); else
        they share one."""
        tag = uuid.uuid4().hex[:8]
        self.broker = broker
        self.tmp = tmp_path
        self.topic = self.app = f"scale-{tag}"
        self.out = f"{self.topic}-out"
        self.group = f"streamkit-{self.app}"
        self.p0 = p0
        self.partitions = partitions
        """The input topic's physical partitions (its capacity)."""
        self.stop_file = tmp_path / "stop"
        self.env = dict(
            os.environ,
            SK_TEST_APP=self.app,
            SK_TEST_TOPIC=self.topic,
            SK_TEST_OUT=self.out,
            STREAMKIT_BROKER=broker,
            STREAMKIT_STATE_DIR=str(tmp_path / "state"),
            STREAMKIT_PROCESSORS=str(p0),
            STREAMKIT_SESSION_TIMEOUT_MS="4000",
            STREAMKIT_HEARTBEAT_INTERVAL_MS="400",
            PYTHONPATH=str(ROOT),
            SK_TEST_WINDOWS="all" if every_window else "tumbling",
        )
        self.every_window = every_window
        self.own_disks = own_disks
        self.workers: list[subprocess.Popen[bytes]] = []
        self._statuses: dict[str, WorkerStatus] = {}
        self._status_offset = 0
        self.producers: list[subprocess.Popen[bytes]] = []

    # -- processes ----------------------------------------------------------------------
    def start_worker(self) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"w{len(self.workers)}.log", "wb")
        cmd = [sys.executable, "-m", "streamkit.cli", "worker", "tests.runtime.scale_app:app", "--log-level", "INFO"]
        env = (
            dict(self.env, STREAMKIT_STATE_DIR=str(self.tmp / f"state-w{len(self.workers)}"))
            if self.own_disks
            else self.env
        )
        worker = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=log)
        self.workers.append(worker)
        return worker

    def start_producer(self, rate: int = 300, *timing: str) -> None:
        """``timing``: the producer's options for its records' timestamps (``soak_producer``)."""
        i = len(self.producers)
        cmd = [sys.executable, "-m", "tests.runtime.soak_producer", self.broker, self.topic, f"p{i}",
               str(self.tmp / f"p{i}.json"), "--keys", str(KEYS), "--rate", str(rate),
               "--stop-file", str(self.stop_file), *timing]  # fmt: skip
        p = subprocess.Popen(
            cmd, cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=open(self.tmp / f"p{i}.log", "wb")
        )
        assert p.stdout is not None and p.stdout.readline().decode().startswith("ready")
        self.producers.append(p)

    @property
    def live_workers(self) -> list[subprocess.Popen[bytes]]:
        return [w for w in self.workers if w.poll() is None]

    def scale(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "streamkit.cli", "scale", "tests.runtime.scale_app:app", *args],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip

    def status(self) -> str:
        """What `streamkit status` prints (wide, so that rows are not cut)."""
        env = dict(self.env, COLUMNS="200")
        result = subprocess.run(
            [sys.executable, "-m", "streamkit.cli", "status", "tests.runtime.scale_app:app"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout

    def kill9(self, pid: int) -> None:
        worker = next(w for w in self.workers if w.pid == pid)
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)

    def stop_producers(self) -> list[dict[str, Any]]:
        """Stop the producers; their reports: records sent."""
        self.stop_file.write_bytes(b"")
        for p in self.producers:
            assert p.wait(30) == 0
        return [orjson.loads((self.tmp / f"p{i}.json").read_bytes()) for i in range(len(self.producers))]

    def stop_workers(self) -> None:
        """SIGTERM: they checkpoint and leave."""
        for w in self.live_workers:
            w.send_signal(signal.SIGTERM)
        for i, w in enumerate(self.workers):
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.send_signal(signal.SIGUSR2)  # its tasks' stacks into its log
                time.sleep(2)
                w.kill()
                tail = (self.tmp / f"w{i}.log").read_text(errors="replace")[-12000:]
                raise AssertionError(f"worker {i} did not stop within 30 s of SIGTERM; its log ends:\n{tail}") from None

    def cleanup(self) -> None:
        self.stop_file.write_bytes(b"")
        for proc in [*self.workers, *self.producers]:
            if proc.poll() is None:
                proc.kill()

    def _disorder(self) -> str:
        """The first records a worker applied out of order, with that worker's log of
        assignments, gates and catch-ups around them (what a failing check shows)."""
        shown = []
        for i in range(len(self.workers)):
            lines = (self.tmp / f"w{i}.log").read_text().splitlines()
            if any("disorder:" in line for line in lines):
                events = [line for line in lines if "disorder:" not in line][:40]
                shown += [f"-- w{i}", *[line for line in lines if "disorder:" in line][:8], *events]
        return "\n" + "\n".join(shown) if shown else ""

    def handovers(self) -> str:
        """Every worker's lines on stores adopted or emptied, rebuilds, and a shrink's key
        sets going live and becoming one (what a window check that fails shows)."""
        said = ("staging store", "emptied", "goes live", "become one", "rebuilding it from", "rebuilt from", "receives")
        shown = []
        for i in range(len(self.workers)):
            lines = (self.tmp / f"w{i}.log").read_text(errors="replace").splitlines()
            shown += [f"-- w{i}", *[line[11:240] for line in lines if any(s in line for s in said)]]
        return "\n" + "\n".join(shown)

    def logs(self) -> str:
        return "".join((self.tmp / f"w{i}.log").read_text() for i in range(len(self.workers)))

    # -- the cluster ----------------------------------------------------------------------
    async def job(self, io: KafkaIO) -> JobLayout:
        job = await read_job(io, self.app)
        assert job is not None
        return job

    async def statuses(self, io: KafkaIO) -> list[WorkerStatus]:
        """The live workers' newest heartbeats, read on from where the last call stopped (the
        status topic holds every test's heartbeats: reading it whole each poll is slow)."""
        records, self._status_offset = await io.read(STATUS_TOPIC, 0, self._status_offset)
        for rec in records:
            if (status := decode_status(rec.value, self.app)) is not None:
                self._statuses[status.worker] = status
        return [s for s in self._statuses.values() if s.alive and not s.stale]

    async def wait_for(self, io: KafkaIO, what: str, check: Any, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            found = await check()
            if found:
                return found
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)

    async def wait_growth(self, io: KafkaIO, more: int) -> None:
        parts = list(range(self.partitions))
        start = sum((await io.committed(self.group, self.topic, parts)).values())
        deadline = time.monotonic() + 60
        while sum((await io.committed(self.group, self.topic, parts)).values()) < start + more:
            assert self.live_workers, "no worker is running"
            assert time.monotonic() < deadline, "the job made no progress"
            await asyncio.sleep(0.1)

    async def wait_consumed(self, io: KafkaIO) -> None:
        parts = list(range(self.partitions))
        deadline = time.monotonic() + 90
        while True:
            committed = await io.committed(self.group, self.topic, parts)
            hws = await io.high_watermarks(self.topic, parts)
            if all(committed.get(p, 0) >= hws[p] for p in parts):
                return
            assert time.monotonic() < deadline, f"not consumed: committed {committed}, high watermarks {hws}"
            await asyncio.sleep(0.2)

    async def finish(self, io: KafkaIO) -> list[dict[str, Any]]:
        """Let the job grow by 600 more records, stop the producers (their reports), wait until
        the group consumed everything, stop the workers."""
        await self.wait_growth(io, 600)
        reports = await asyncio.to_thread(self.stop_producers)
        await self.wait_consumed(io)
        return reports

    # -- the checks -----------------------------------------------------------------------
    def stores(self, processors: int) -> Path:
        """The directory of the job's stores after the workers stopped: each processor's
        ``processor-N``. With ``own_disks``, a directory of links, each to the newest store of
        that processor on any worker's disk (the furthest read; the others are copies left
        behind by a move or a kill, or standbys)."""
        shared = self.tmp / "state" / self.app
        if not self.own_disks:
            return shared
        newest = self.tmp / "stores" / self.app
        newest.mkdir(parents=True, exist_ok=True)
        for pid in range(processors):
            found = []
            for path in sorted(self.tmp.glob(f"state-w*/{self.app}/processor-{pid}")):
                with RocksDBStore.open(str(path), []) as store:
                    checkpoint = store.checkpoint()
                found.append((sum(checkpoint.positions.values()), checkpoint.generation, str(path)))
            assert found, f"no worker has a store of processor {pid}"
            link = newest / f"processor-{pid}"
            link.unlink(missing_ok=True)
            link.symlink_to(max(found)[2])
        return newest

    def app_object(self) -> Any:
        """The job's App, as its workers load it."""
        from tests.runtime.scale_app import make_app

        return make_app(self.app, self.topic, self.out, every_kind=self.every_window)

    def verify(
        self,
        reports: list[dict[str, Any]],
        processors: int,
        counts: tuple[int, ...] = (),
        producers: list[str] | None = None,
        clean: bool = False,
    ) -> None:
        """State: the whole stream applied once, each key on its processor only.
        Output: every input record's output exists, each key's in the producers' order,
        and was emitted by a processor that owned the key at one of the job's processor
        ``counts`` (no other processor ever handled it). ``producers``: the name of each
        report's producer (default p0, p1, ...). Windows: ``scale_windows.verify_windows``;
        ``clean``: a run without crashes or zombies (every close once, with its final value)."""
        expected: dict[str, dict[str, list[int]]] = {}
        names = producers or [f"p{i}" for i in range(len(reports))]
        for name, report in zip(names, reports, strict=True):
            for k in range(min(KEYS, report["sent"])):
                seqs = range(k, report["sent"], KEYS)
                expected.setdefault(f"k{k}", {})[name] = [len(seqs), seqs[-1], 0]
        state: dict[str, Any] = {}
        stores = self.stores(processors)
        for pid in range(processors):
            with RocksDBStore.open(str(stores / f"processor-{pid}"), ["seen"]) as store:
                for k, v in store.items("seen"):
                    key = k.decode()
                    assert key not in state, f"{key} is in two processors' stores"
                    assert lh_bucket(key_hash(k), self.p0, processors) == pid, f"{key} left in processor {pid}"
                    state[key] = orjson.loads(v)
        wrong = {k: (state.get(k), want) for k, want in expected.items() if state.get(k) != want}
        if state != expected:
            e_g = list(wrong.items())[:3]
            raise AssertionError(f"{len(wrong)} keys differ (state, expected), e.g. {e_g}" + self._disorder())

        verify_windows(self.broker, self.topic, self.out, stores, processors, state, clean, self.every_window)

        async def read_out() -> list[Any]:
            async with KafkaIO(self.broker) as io:
                return await io.read_topic(self.out)

        outputs: dict[tuple[str, str], list[int]] = {}
        owners = {c: {k: lh_bucket(key_hash(f"k{k}".encode()), self.p0, c) for k in range(KEYS)} for c in counts}
        emitted_by: dict[tuple[str, str, int], int] = {}
        for rec in asyncio.run(read_out()):
            v = orjson.loads(rec.value)
            outputs.setdefault((rec.key.decode(), v["p"]), []).append(v["seq"])
            emitted_by[(rec.key.decode(), v["p"], v["seq"])] = v["processor"]
            if counts:
                k = int(rec.key.decode()[1:])
                assert v["processor"] in {owners[c][k] for c in counts}, f"k{k} handled by processor {v['processor']}"
        for key, per in expected.items():
            for producer, (count, last, _) in per.items():
                firsts = list(dict.fromkeys(outputs.get((key, producer), [])))
                if len(firsts) != count or firsts[-1] != last:
                    raise AssertionError(self._missing_output(key, producer, firsts, count, emitted_by))
                assert firsts == sorted(firsts), f"{key}/{producer}: outputs out of order"

    def _missing_output(
        self, key: str, producer: str, firsts: list[int], count: int, emitted_by: dict[tuple[str, str, int], int]
    ) -> str:
        """Which of a key's outputs are missing, where their input records lie, and which
        processors emitted the outputs around them."""
        seqs = range(int(key[1:]), int(key[1:]) + KEYS * count, KEYS)
        missing = sorted(set(seqs) - set(firsts))

        async def inputs() -> dict[int, str]:
            async with KafkaIO(self.broker) as io:
                found = {}
                for rec in await io.read_topic(self.topic):
                    v = orjson.loads(rec.value)
                    if rec.key.decode() == key and v["p"] == producer:
                        found[v["seq"]] = f"{rec.partition}@{rec.offset}"
                return found

        where = asyncio.run(inputs())
        around = {s: emitted_by.get((key, producer, s)) for m in missing for s in (m - KEYS, m + KEYS)}
        return (
            f"{key}/{producer}: {len(firsts)} outputs of {count}; missing seqs {missing} "
            f"(input at {[where.get(m) for m in missing]}); emitted by processors {around}; "
            f"inputs before/after {[where.get(m - KEYS) for m in missing]} {[where.get(m + KEYS) for m in missing]}"
        )
