"""The command line tells the truth: one broker rule, one line per mistake, a version."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")}
    return subprocess.run(
        [sys.executable, "-m", "streamkit.cli", *args],
        env={**base, "PYTHONPATH": str(ROOT), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_version() -> None:
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"streamkit {version('streamkit')}"


def test_every_command_needs_a_broker_the_same_way() -> None:
    assert "no broker: give --broker or set STREAMKIT_BROKER" in one_error_line(cli("topics", "describe", "orders"))
    err = one_error_line(cli("worker", "examples.orders:app"))
    assert "no broker: give --broker or set STREAMKIT_BROKER" in err and "--embedded-broker" in err
    for command in ("status", "scale"):
        args = (command, "examples.orders:app") + (("--processors", "3") if command == "scale" else ())
        assert "--broker" in one_error_line(cli(*args)) and "STREAMKIT_BROKER" in one_error_line(cli(*args))
    assert "STREAMKIT_BROKER" in cli("--help").stdout


def test_worker_members_are_not_the_jobs_processors() -> None:
    err = one_error_line(cli("worker", "examples.orders:app", "--processors", "2", STREAMKIT_BROKER="127.0.0.1:1"))
    assert "--members" in err and "streamkit scale" in err


def test_a_bad_setting_is_one_line_naming_it_its_source_and_value() -> None:
    err = one_error_line(cli("status", "examples.orders:app", STREAMKIT_PROCESSORS="abc"))
    assert "environment variable STREAMKIT_PROCESSORS: processors='abc'" in err


def test_an_unreachable_broker_says_it_retries_then_one_line() -> None:
    proc = cli("worker", "examples.orders:app", "--log-level", "INFO", STREAMKIT_BROKER="127.0.0.1:1")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and "connecting to broker 127.0.0.1:1 (retrying" in lines[0], proc.stderr
    assert lines[-1] == "error: no Kafka broker answers at 127.0.0.1:1 (connection refused)"


def test_a_dashboard_port_in_use_is_one_line() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = one_error_line(
            cli("dashboard", "examples.orders:app", "--port", str(port), STREAMKIT_BROKER="127.0.0.1:1")
        )
    assert f"cannot serve the dashboard on 127.0.0.1:{port}" in err, err


def test_a_worker_starts_an_embedded_broker_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens on the network unless asked: the library's worker refuses to start
    with no broker named, and `streamkit worker --embedded-broker` starts one."""
    import asyncio

    import streamkit
    from streamkit.errors import ConfigError
    from streamkit.runtime.worker import Worker

    for name in ("STREAMKIT_BROKER", "STREAMKIT_CLIENT_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    app = streamkit.App("no-broker", state_dir=tmp_path)

    @app.processor(app.topic("in"))
    def handle(key: Any, value: Any, ctx: streamkit.Context) -> None: ...

    worker = Worker(app, 1)
    with pytest.raises(ConfigError, match="no broker: give one .* or ask for an embedded one"):
        asyncio.run(worker.run())
    assert worker._embedded is None
    asked = cli("worker", "examples.orders:app", "--embedded-broker", STREAMKIT_STATE_DIR=str(tmp_path / "s"))
    assert "started an embedded broker at 127.0.0.1:" in asked.stderr, asked.stderr
    assert "topic 'orders' does not exist" in asked.stderr  # it got as far as the broker, which is empty


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (("--catch-up", "0"), "--catch-up 0.0: need a number of seconds > 0"),
        (("--catch-up", "nan"), "--catch-up nan: need a number of seconds > 0"),
        (("--stabilization", "-1"), "--stabilization -1.0: need a number of seconds >= 0"),
        (("--retry-after", "nan"), "--retry-after nan: need a number of seconds >= 0"),
        (("--interval", "0"), "--interval 0.0: need a number of seconds > 0"),
        (("--window", "inf"), "--window inf: need a number of seconds > 0"),
    ],
)
def test_the_autoscaler_refuses_a_bad_time_at_start_in_one_line(option: tuple[str, str], says: str) -> None:
    """Before any worker is started (a zero catch-up divided by zero at every look, and a
    NaN stabilization scaled in at the first)."""
    err = one_error_line(cli("autoscale", "examples.orders:app", "--max", "2", *option, STREAMKIT_BROKER="127.0.0.1:1"))
    assert says in err
