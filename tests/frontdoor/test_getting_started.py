"""The getting-started page, followed as a newcomer pastes it: every bash block marked as
run by this test, in order, in one shell-like session (``export`` carries over, a line
ending in ``&`` runs in the background, ``source .venv/bin/activate`` puts this venv on
PATH), in a fresh directory beside a link to ``examples/``. The only change to what is
written: the fixed ports (9092, 9500, 9501) become free ones, so that the test never
meets another program's broker.

Then what the commands printed is checked against what the page promises: the first
windowed app's final counts, the orders of the tour handled exactly (every customer's
total as a reference computes it from the same orders, on both workers' query ports),
scaling up and back down settled, big orders and dead letters readable."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.order_producer import expected_totals
from tests.ports import listen_port

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs/getting-started.md"
MARK = "tests/frontdoor/test_getting_started.py"


def blocks(kind: str) -> list[str]:
    """The page's ``kind`` blocks marked as run (or checked) by this test, in order (the
    install block is only checked, by the test below: it is scripts/demo and scripts/test)."""
    marked = r"<!-- (?!install:)[^>]*" + re.escape(MARK) + r"[^>]*-->\s*```" + kind + r"\n(.*?)```"
    found = re.findall(marked, PAGE.read_text(), re.S)
    assert found, f"{PAGE} lost its {kind} blocks marked for {MARK}"
    return found


def commands(block: str) -> list[str]:
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


class Session:
    """Runs pasted commands as a shell would, in ``cwd``, keeping what they printed."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")}
        self.env["PYTHONPATH"] = str(ROOT)
        self.ports = {"9092": str(listen_port()), "9500": str(listen_port()), "9501": str(listen_port())}
        self.background: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.printed: dict[str, str] = {}

    def paste(self, written: str) -> str:
        """Run one line as written (its ports made free ones); what it printed is kept under
        the line as written."""
        line = written
        for fixed, port in self.ports.items():
            line = re.sub(rf"\b{fixed}\b", port, line)
        argv = shlex.split(line)
        if argv[0] == "source":
            assert argv[1] == ".venv/bin/activate", line
            self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env['PATH']}"
            self.env["VIRTUAL_ENV"] = str(Path(sys.executable).parents[1])
            return ""
        if argv[0] == "export":
            name, _, value = argv[1].partition("=")
            self.env[name] = value
            return ""
        if argv[-1] == "&":
            self.start(line, argv[:-1])
            return ""
        done = subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=300)
        out = done.stdout + done.stderr
        assert done.returncode == 0, f"{line}: exit {done.returncode}\n{out[-4000:]}\n{self.logs()}"
        self.printed[written] = done.stdout
        return done.stdout

    def start(self, line: str, argv: list[str]) -> None:
        log = self.cwd / f"background-{len(self.background)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.background.append((line, proc, log))
        if argv[:2] == ["streamkit", "broker"]:  # the next line uses it: wait until it says it listens
            deadline = time.monotonic() + 60
            while "broker listening on" not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)

    def logs(self) -> str:
        return "\n".join(f"--- {line}\n{log.read_text()[-2000:]}" for line, _, log in self.background)

    def stop(self) -> None:
        for _, proc, _ in reversed(self.background):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    s = Session(tmp_path)
    try:
        yield s
    finally:
        s.stop()


def consumed_values(printed: str) -> list[dict[str, object]]:
    return [json.loads(v) for v in re.findall(r"^\s*value: (\{.*\})$", printed, re.M)]


def test_the_install_block_is_the_two_readme_commands_and_the_first_app_is_the_example() -> None:
    install = re.search(r"<!-- install:[^>]*-->\s*```bash\n(.*?)```", PAGE.read_text(), re.S)
    assert install is not None and commands(install.group(1)) == ["scripts/demo", "scripts/test"]
    readme = (ROOT / "README.md").read_text()
    assert "scripts/demo" in readme and "scripts/test" in readme
    [first_app] = blocks("python")[:1]
    assert first_app == (ROOT / "examples" / "page_views.py").read_text()


def test_the_page_pasted_as_written_runs_the_first_app_and_the_tour(session: Session) -> None:
    bash = blocks("bash")
    assert len(bash) == 4, "the page's run blocks: setup, run it, watch it, the tour"
    setup, run_it, watch_it, tour = (commands(b) for b in bash)
    for line in setup + run_it:
        session.paste(line)

    # Run it: the first four minutes' final counts, 20 views a user and minute.
    finals = consumed_values(session.printed[run_it[-1]])
    minutes = [1_767_225_600_000 + 60_000 * m for m in range(4)]
    assert sorted((v["minute"], v["views"]) for v in finals) == sorted((m, 20) for m in minutes for _ in range(3))

    # Watch it: the topics, the status table and the same as JSON.
    for line in watch_it:
        session.paste(line)
    listed = session.printed[watch_it[0]]
    assert re.search(r"^page-views\s+1\b", listed, re.M) and "views-per-minute" in listed, listed
    status = json.loads(session.printed[watch_it[2]])
    assert isinstance(status, dict) and status, status

    # The tour: every order handled, scaled up and back down, queries on either worker.
    for line in tour:
        session.paste(line)
    orders = int(re.search(r"--orders (\d+)", " ".join(tour)).group(1))  # type: ignore[union-attr]
    expected, _, bad = expected_totals(orders, 200, 7, 1_767_225_600_000)
    query = next(line for line in tour if line.startswith("streamkit query"))
    answer = json.loads(session.printed[query])
    assert answer["value"] == expected["customer-0007"], answer
    curl = next(line for line in tour if line.startswith("curl"))
    assert json.loads(session.printed[curl])["value"] == expected["customer-0042"]
    big = consumed_values(session.printed[next(line for line in tour if "consume big-orders" in line)])
    assert len(big) == 3 and all(int(v["amount"]) >= 90_000 for v in big), big  # type: ignore[call-overload]
    dead = session.printed[next(line for line in tour if "dead-letters" in line)]
    assert dead.count("reason: handler") == 2, dead
    # every malformed order a dead letter, and nothing else (no order late for its minute)
    after = json.loads(session.paste("streamkit status examples.orders:app --json"))
    assert after["dead_letters"] == {"handler": bad} and not after["unsettled"], after

    # Every customer, asked on either worker, as the reference says; both workers hold keys.
    served_by: set[str] = set()
    for port in (session.ports["9500"], session.ports["9501"]):
        for customer, totals in expected.items():
            url = f"http://127.0.0.1:{port}/tables/customer_totals/{customer}"
            with urllib.request.urlopen(url, timeout=30) as reply:
                got = json.loads(reply.read())
            assert got["value"] == totals, (customer, got)
            served_by.add(got["worker"])
    assert len(served_by) == 2, served_by


def test_the_test_it_block_passes_under_pytest(tmp_path: Path) -> None:
    _, test_it = blocks("python")
    (tmp_path / "test_page_views.py").write_text(test_it)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_page_views.py"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
