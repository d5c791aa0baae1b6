"""The root command: ``--broker`` before the sub-command (as the connection options go
there), and errors said in words, never as a Python class name."""

from __future__ import annotations

import os
import subprocess
import sys

from streamkit.cli import CliError, error_line
from streamkit.query import QueryError


def streamkit(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")}
    return subprocess.run(
        [sys.executable, "-m", "streamkit.cli", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_broker_before_the_command_is_taken(broker: str, topic_factory) -> None:  # type: ignore[no-untyped-def]
    topic = topic_factory(2)
    listed = streamkit("--broker", broker, "topics", "list")
    assert listed.returncode == 0, listed.stderr
    assert any(line.split()[:2] == [topic, "2"] for line in listed.stdout.splitlines()), listed.stdout
    refused = streamkit("-b", "127.0.0.1:1", "topics", "list")
    assert refused.returncode == 1 and refused.stderr.startswith("error: cannot connect to Kafka at 127.0.0.1:1")


def test_errors_are_said_in_words() -> None:
    assert error_line(QueryError("app 'shop' has no table 'totals' (tables: ['orders'])", 404)) == (
        "app 'shop' has no table 'totals' (tables: ['orders'])"
    )
    assert error_line(CliError("no broker: give --broker")) == "no broker: give --broker"
    assert error_line(FileNotFoundError(2, "No such file or directory", "views.jsonl")) == "no such file: views.jsonl"
    assert error_line(ValueError("bad value")) == "bad value"
    unexpected = error_line(KeyError("x"))
    assert unexpected.startswith("unexpected KeyError") and "STREAMKIT_DEBUG=1" in unexpected
    missing = streamkit("produce", "t", "no-such-file.jsonl", "--key-field", "k", "--broker", "127.0.0.1:1")
    assert missing.returncode != 0 and missing.stderr.startswith("error: ")
    assert "Error" not in missing.stderr and "no-such-file.jsonl" in missing.stderr, missing.stderr
