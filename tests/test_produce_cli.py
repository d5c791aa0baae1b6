"""`streamkit produce`: JSON lines through the layout-aware producer, every record where
the topic's layout places its key (none in reserved capacity), bad lines named."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from streamkit.cli import app as cli
from streamkit.cli.produce import parse_line
from streamkit.testing import create_topic, read_topic, unique_topic_name


def test_produce_places_every_line_by_the_layout(broker: str, tmp_path: Path) -> None:
    topic = f"produce-{uuid.uuid4().hex[:8]}"
    runner = CliRunner()
    res = runner.invoke(cli, ["topics", "create", topic, "--partitions", "3", "--capacity", "8", "--broker", broker])
    assert res.exit_code == 0, res.output
    lines = tmp_path / "orders.jsonl"
    rows = [{"customer": f"c{i % 97}", "amount": i} for i in range(2_000)]
    lines.write_text("\n".join(orjson.dumps(r).decode() for r in rows) + "\n\n")
    res = runner.invoke(cli, ["produce", topic, str(lines), "--key-field", "customer", "--broker", broker])
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "2,000 records to " + topic in res.stdout
    records = read_topic(broker, topic)
    assert len(records) == 2_000
    for rec in records:
        assert rec.key is not None and rec.value is not None
        assert rec.partition == lh_bucket(key_hash(rec.key), 3, 3)  # never in partitions 3..7
        assert orjson.loads(rec.value)["customer"] == rec.key.decode()

    bad = tmp_path / "bad.jsonl"
    bad.write_text('a|{"amount": 1}\nb|{"amount": 2}\nc|{amount: 3}\n')
    res = runner.invoke(cli, ["produce", topic, str(bad), "--key-separator", "|", "--broker", broker])
    assert res.exit_code != 0
    assert str(res.exception).startswith(f"{bad}:3: not JSON") and "the 2 records before it were sent" in str(
        res.exception
    )
    assert len(read_topic(broker, topic)) == 2_002


ROOT = Path(__file__).resolve().parents[1]


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


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(orjson.dumps(r).decode() + "\n" for r in rows))
    return path


def test_produce_refuses_keyless_records_unless_told_no_key(broker: str, tmp_path: Path) -> None:
    topic = create_topic(broker, unique_topic_name("keyless"), 2)
    rows = jsonl(tmp_path / "rows.jsonl", [{"amount": i} for i in range(3)])
    err = error_line(streamkit(broker, "produce", topic, str(rows)))
    assert "would have no key" in err and "--key-field" in err and "--no-key" in err, err
    assert read_topic(broker, topic) == []
    assert "not both" in error_line(streamkit(broker, "produce", topic, str(rows), "--no-key", "-k", "amount"))

    sent = streamkit(broker, "produce", topic, str(rows), "--no-key", "--no-progress")
    assert sent.returncode == 0, sent.stderr
    records = read_topic(broker, topic)
    assert sorted(orjson.loads(r.value or b"null")["amount"] for r in records) == [0, 1, 2]
    assert {r.key for r in records} == {None}


def test_produce_names_the_line_without_the_key_field(broker: str, tmp_path: Path) -> None:
    topic = create_topic(broker, unique_topic_name("keyed"), 1)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"customer": "c1"}\n\n{"customer": null}\n{"amount": 2}\n')
    err = error_line(streamkit(broker, "produce", topic, str(rows), "--key-field", "customer", "--no-progress"))
    assert err == f"error: {rows}:3: field 'customer' is null: no key to take from it; the record before it was sent"
    assert [r.key for r in read_topic(broker, topic)] == [b"c1"]


def test_produce_takes_each_records_timestamp_from_a_field(broker: str, tmp_path: Path) -> None:
    topic = create_topic(broker, unique_topic_name("timed"), 1)
    given = {
        "ms": 1714564800123,
        "utc": "2024-05-01T12:00:00.456Z",
        "offset": "2024-05-01T14:00:00.789+02:00",
        "naive": "2024-05-01T12:00:01",  # taken as UTC
        "date": "2024-05-02",
    }
    expected = {
        "ms": 1714564800123,
        "utc": 1714564800456,
        "offset": 1714564800789,
        "naive": 1714564801000,
        "date": 1714608000000,
    }
    rows = jsonl(tmp_path / "rows.jsonl", [{"id": name, "at": at} for name, at in given.items()])
    sent = streamkit(broker, "produce", topic, str(rows), "-k", "id", "--timestamp-field", "at", "--no-progress")
    assert sent.returncode == 0, sent.stderr
    assert {r.key.decode(): r.timestamp for r in read_topic(broker, topic) if r.key} == expected

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "at": 1714564800123}\n{"id": "y", "at": "next tuesday"}\n')
    err = error_line(streamkit(broker, "produce", topic, str(bad), "-k", "id", "-t", "at", "--no-progress"))
    assert err.startswith(f"error: {bad}:2: field 'at' is 'next tuesday': neither milliseconds since the epoch nor")


def test_a_timestamp_field_takes_milliseconds_or_iso_8601_and_nothing_else() -> None:
    assert parse_line('{"k": "a", "t": 5}', "k", None, "t") == ("a", {"k": "a", "t": 5}, 5)
    assert parse_line('{"k": 7, "t": "1970-01-01T00:00:00.002Z"}', "k", None, "t")[::2] == ("7", 2)
    for value, why in (
        ("-1", "milliseconds since the epoch must be 0 to"),
        ("true", "neither milliseconds since the epoch nor an ISO-8601 time"),
        ('"1969-12-31T23:59:59Z"', "before 1970"),
        ("[1]", "neither milliseconds"),
        ("null", "field 't' is null: no timestamp to take from it"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_line(f'{{"k": "a", "t": {value}}}', "k", None, "t")
    with pytest.raises(ValueError, match="field 't' is missing"):
        parse_line('{"k": "a"}', "k", None, "t")
