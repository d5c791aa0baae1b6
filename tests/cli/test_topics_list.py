"""`streamkit topics list`: every topic with the partitions the broker has and, where a
layout says, those producers write to; streamkit's internal topics only with --all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

from streamkit.testing import create_topic, unique_topic_name

ROOT = Path(__file__).resolve().parents[2]


def streamkit(broker: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The real command, as a user runs it (the broker from STREAMKIT_BROKER)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")}
    return subprocess.run(
        [sys.executable, "-m", "streamkit.cli", *args],
        env={**env, "PYTHONPATH": str(ROOT), "STREAMKIT_BROKER": broker},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_topics_list_shows_physical_and_active_partitions_and_hides_internal_topics(broker: str) -> None:
    laid = unique_topic_name("listed")
    plain = create_topic(broker, unique_topic_name("plain"), 3)
    made = streamkit(broker, "topics", "create", laid, "--partitions", "2", "--capacity", "5")
    assert made.returncode == 0, made.stderr

    listed = streamkit(broker, "topics", "list")
    assert listed.returncode == 0, listed.stderr
    header, *lines, footer = listed.stdout.splitlines()
    assert header.split() == ["TOPIC", "PARTITIONS", "ACTIVE"]
    rows = {line.split()[0]: line.split()[1:] for line in lines}
    assert rows[laid] == ["5", "2"]  # 3 partitions reserved
    assert rows[plain] == ["3", "-"]  # no layout
    assert not [name for name in rows if name.startswith("__")]
    assert footer.endswith("internal hidden: --all shows them)"), footer

    everything = streamkit(broker, "topics", "list", "--all", "--json")
    assert everything.returncode == 0, everything.stderr
    by_name = {row["topic"]: row for row in orjson.loads(everything.stdout)}
    assert by_name[laid] == {"topic": laid, "partitions": 5, "active": 2, "epoch": 1, "internal": False}
    assert by_name[plain] == {"topic": plain, "partitions": 3, "active": None, "epoch": None, "internal": False}
    assert by_name["__streamkit_layouts"]["internal"] is True
