"""The README's tour ("Run it"), run as a new user would: its commands are read from the
README (so the two cannot drift apart) and run in a fresh directory, the broker and the
worker in the background. Every order the README's producer wrote must be handled: the
customers' totals in the stores equal a reference computed from the same orders, and the
malformed ones are dead letters. Then the same directory meets a new broker: the worker
stops with the one-line incarnation error, and `streamkit reset` makes it work."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from examples.order_producer import expected_totals
from stores.rocksdb import RocksDBStore

ROOT = Path(__file__).resolve().parents[1]
APP = "examples.orders:app"


def tour_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- tour:[^>]*-->\s*```bash\n(.*?)```", text, re.S)
    assert m is not None, "README lost its tour block"
    lines = [line.split("#", 1)[0].strip() for line in m.group(1).splitlines()]
    return [line for line in lines if line]


class Tour:
    """Runs the tour's commands in ``cwd``: ``streamkit broker`` and ``streamkit worker``
    in the background (as a reader would in other terminals), the rest to completion."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        bindir = Path(sys.executable).parent
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
        self.env.pop("STREAMKIT_BROKER", None)
        self.background: list[subprocess.Popen[str]] = []
        self.worker: subprocess.Popen[str] | None = None
        self.broker: subprocess.Popen[str] | None = None

    def start_broker(self) -> None:
        self.broker = subprocess.Popen(
            ["streamkit", "broker"], cwd=self.cwd, env=self.env, stdout=subprocess.PIPE, text=True
        )
        self.background.append(self.broker)
        assert self.broker.stdout is not None
        first = self.broker.stdout.readline()
        m = re.match(r"broker listening on (\S+)", first)
        assert m is not None, f"streamkit broker printed {first!r}"
        self.address = m.group(1)

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        argv = shlex.split(command)
        if argv[:2] == ["streamkit", "broker"]:
            self.start_broker()
            return subprocess.CompletedProcess(argv, 0, "", "")
        if argv[0] == "export":
            name, _, _ = argv[1].partition("=")
            assert name == "STREAMKIT_BROKER", command
            self.env["STREAMKIT_BROKER"] = self.address
            return subprocess.CompletedProcess(argv, 0, "", "")
        if argv[:2] == ["streamkit", "worker"]:
            self.worker = subprocess.Popen(
                argv, cwd=self.cwd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            self.background.append(self.worker)
            return subprocess.CompletedProcess(argv, 0, "", "")
        done = subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done

    def stop(self, proc: subprocess.Popen[str] | None) -> None:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_all(self) -> None:
        for proc in reversed(self.background):
            self.stop(proc)


@pytest.fixture
def tour(tmp_path: Path) -> Iterator[Tour]:
    t = Tour(tmp_path)
    try:
        yield t
    finally:
        t.stop_all()


def orders_produced(commands: list[str]) -> int:
    producer = next(c for c in commands if "examples.order_producer" in c)
    m = re.search(r"--orders (\d+)", producer)
    return int(m.group(1)) if m else 10_000


def check_everything_handled(tour: Tour, orders: int) -> None:
    """Wait until the group has committed every partition, stop the worker, and compare
    the stores and the dead letters with a reference computed from the same orders."""
    tour.run(f"streamkit status {APP} --wait-caught-up 180")
    worker = tour.worker
    tour.stop(worker)
    assert worker is not None and worker.returncode == 0, worker.stderr.read()[-3000:] if worker else ""
    totals: dict[str, dict[str, int]] = {}
    for path in sorted((tour.cwd / ".streamkit" / "orders-demo").glob("processor-*")):
        with RocksDBStore.open(str(path), ["customer_totals", "revenue_per_minute"]) as store:
            for k, v in store.items("customer_totals"):
                assert k.decode() not in totals, f"customer {k.decode()} is in two stores"
                totals[k.decode()] = orjson.loads(v)
    expected, _, bad = expected_totals(orders, 200, 7, 1_767_225_600_000)
    assert totals == expected
    status = tour.run(f"streamkit status {APP}").stdout
    assert re.search(rf"│ handler +│ +{bad} │", status), status


def test_the_readme_tour_handles_every_record_and_a_stale_directory_is_refused_then_reset(tour: Tour) -> None:
    commands = tour_commands()
    assert commands[0] == "streamkit broker" and any(c.startswith("streamkit worker") for c in commands)
    for command in commands:
        tour.run(command)
    orders = orders_produced(commands)
    check_everything_handled(tour, orders)

    # The same directory against a new broker: the stores belong to the old cluster.
    tour.stop_all()
    tour.background.clear()
    for command in commands:
        tour.run(command)
    worker = tour.worker
    assert worker is not None
    _, err = worker.communicate(timeout=120)
    assert worker.returncode not in (0, None)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    assert "belongs to another incarnation of job 'orders-demo'" in errors[0]
    assert "streamkit reset" in errors[0], errors[0]

    tour.run(f"streamkit reset {APP}")
    tour.run(next(c for c in commands if c.startswith("streamkit worker")))
    check_everything_handled(tour, orders)
