"""THE crash test: SIGKILL a real writer process at random instants, many times.

Each round starts ``crash_writer.py`` (which resumes from the store's
checkpoint), waits for a random amount of progress read from its stdout,
kills it with SIGKILL and then checks, in this process, that the reopened
store equals EXACTLY the reference state for the checkpointed position: no
record lost, none applied twice, deletes applied, and no completed commit lost
(the checkpoint is at least the last position the writer reported as
committed, which holds with the default ``sync=False``: see stores/rocksdb.py).

The control test runs the same campaign against a writer that splits its
commits (the checkpoint lands before all of its changes) and requires the
campaign to detect the damage, so this test is known to be able to fail.

``STORES_CRASH_KILLS=<n>`` runs a longer campaign.
"""

from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import crash_writer
import orjson
import pytest
from stores_testutil import HERE, PYTHON, subprocess_env

from stores import RocksDBStore

WRITER = str(HERE / "crash_writer.py")
KILLS = int(os.environ.get("STORES_CRASH_KILLS", "60"))
MIN_KILLS = 30
BUDGET_S = float(os.environ.get("STORES_CRASH_BUDGET_S", "30"))


class Reference:
    """The expected store contents after the first ``n`` records, computed
    here by replaying the record rule of crash_writer.py on plain dicts and
    encoding with struct/orjson directly (independent of stores' serdes and
    CachedTable).  Positions only move forward, so it advances incrementally."""

    def __init__(self) -> None:
        self.n = 0
        self.sums: dict[int, int] = {}
        self.counts: dict[int, int] = {}
        self.last: dict[int, int] = {}

    def advance(self, n: int) -> None:
        if n < self.n:
            self.__init__()  # type: ignore[misc]
        for i in range(self.n, n):
            k = i % crash_writer.KEYS
            self.sums[k] = self.sums.get(k, 0) + i
            self.counts[k] = self.counts.get(k, 0) + 1
            if i % 3 == 0:
                self.last.pop(k, None)
            else:
                self.last[k] = i
        self.n = n

    def tables(self) -> dict[str, dict[bytes, bytes]]:
        key = struct.Struct(">q").pack
        return {
            "sums": {key(k): key(v) for k, v in self.sums.items()},
            "counts": {key(k): orjson.dumps(v) for k, v in self.counts.items()},
            "last": {key(k): orjson.dumps({"i": v}) for k, v in self.last.items()},
        }


@dataclass
class Campaign:
    kills: int = 0
    startup_kills: int = 0
    #: kills after which the store held commits the writer had not yet reported
    #: (the kill raced the writer rather than finding it idle)
    raced: int = 0
    mismatches: list[str] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    elapsed: float = 0.0


def verify(path: Path, last_reported: int, ref: Reference) -> tuple[int, str | None]:
    """Reopen the store; return (position, description of any damage)."""
    if not (path / "CURRENT").exists():
        return 0, None  # killed before RocksDB created anything
    with RocksDBStore.open(path, crash_writer.TABLES) as store:
        cp = store.checkpoint()
        n = cp.position(*crash_writer.TOPIC)
        problems = []
        if n < last_reported:
            problems.append(f"lost completed commits: checkpoint {n} < reported {last_reported}")
        if cp.extra.get("records", 0) != n:
            problems.append(f"checkpoint extra {cp.extra} disagrees with position {n}")
        ref.advance(n)
        expected = ref.tables()
        for table in crash_writer.TABLES:
            got = dict(store.items(table))
            want = expected[table]
            if got != want:
                diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
                problems.append(f"table {table}: {len(diff)} keys differ from the reference at position {n}")
        return n, "; ".join(problems) or None


def run_campaign(path: Path, mode: str, kills: int, rng: random.Random, stop_on_mismatch: bool) -> Campaign:
    result = Campaign()
    ref = Reference()
    t0 = time.monotonic()
    env = subprocess_env()
    while result.kills < kills:
        if result.kills >= MIN_KILLS and time.monotonic() - t0 > BUDGET_S:
            break
        every = rng.choice([50, 300, 300, 1000])
        proc = subprocess.Popen(
            [PYTHON, WRITER, "--path", str(path), "--every", str(every), "--mode", mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        last_reported = 0
        startup = rng.random() < 0.15
        try:
            if startup:
                # during interpreter start, RocksDB open or WAL recovery
                time.sleep(rng.uniform(0.0, 0.2))
                result.startup_kills += 1
            else:
                line = proc.stdout.readline()  # type: ignore[union-attr]
                assert line.startswith("START "), f"writer failed to start: {line!r}"
                last_reported = int(line.split()[1])
                for _ in range(rng.randint(0, 4)):
                    line = proc.stdout.readline()  # type: ignore[union-attr]
                    assert line.startswith("C "), f"writer stopped: {line!r}"
                    last_reported = int(line.split()[1])
                # land anywhere inside a checkpoint interval (one is ~1 ms at every=300)
                time.sleep(rng.uniform(0.0, 0.003))
        finally:
            proc.send_signal(signal.SIGKILL)
            _, err = proc.communicate()
        if proc.returncode != -signal.SIGKILL:
            raise AssertionError(f"writer exited by itself ({proc.returncode}) instead of being killed:\n{err}")
        result.kills += 1
        n, problem = verify(path, last_reported, ref)
        result.positions.append(n)
        result.raced += not startup and n > last_reported
        if problem:
            result.mismatches.append(f"kill {result.kills} (mode={mode}, every={every}): {problem}")
            if stop_on_mismatch:
                break
    result.elapsed = time.monotonic() - t0
    return result


@pytest.mark.timeout(180)
def test_sigkill_at_random_instants_never_loses_or_duplicates(tmp_path: Path) -> None:
    seed = int(os.environ.get("STORES_CRASH_SEED", random.randrange(2**32)))
    result = run_campaign(tmp_path / "store", "atomic", KILLS, random.Random(seed), stop_on_mismatch=False)
    summary = (
        f"seed={seed} kills={result.kills} (startup {result.startup_kills}) "
        f"final position={result.positions[-1] if result.positions else 0} "
        f"distinct positions={len(set(result.positions))} raced={result.raced} elapsed={result.elapsed:.1f}s"
    )
    print("\ncrash campaign:", summary)
    assert not result.mismatches, summary + "\n" + "\n".join(result.mismatches)
    assert result.kills >= MIN_KILLS, summary
    # The writer made progress across restarts (kills did not all land at start-up).
    assert result.positions[-1] > 0 and len(set(result.positions)) >= result.kills // 3, summary
    assert result.positions == sorted(result.positions), "a checkpoint went backwards: " + summary


@pytest.mark.timeout(120)
def test_control_campaign_detects_non_atomic_commits(tmp_path: Path) -> None:
    """Same harness, a writer whose checkpoint is not atomic with its changes:
    the campaign must report damage, proving the test above can fail."""
    seed = int(os.environ.get("STORES_CRASH_SEED", random.randrange(2**32)))
    result = run_campaign(tmp_path / "store", "split", 20, random.Random(seed), stop_on_mismatch=True)
    print(f"\ncontrol campaign: seed={seed} detected after {result.kills} kills: {result.mismatches[:1]}")
    assert result.mismatches, f"non-atomic commits went undetected in {result.kills} kills (seed={seed})"


@pytest.mark.parametrize("mode", ["atomic", "split"])
def test_writer_run_to_completion_matches_reference(tmp_path: Path, mode: str) -> None:
    """Harness check: without kills both writer modes end in the reference
    state, so a mismatch in the campaigns can only come from the crash."""
    path = tmp_path / "store"
    out = subprocess.run(
        [PYTHON, WRITER, "--path", str(path), "--every", "300", "--total", "4500", "--mode", mode],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-2:] == ["C 4500", "DONE"]
    n, problem = verify(path, 4500, Reference())
    assert n == 4500 and problem is None, problem
