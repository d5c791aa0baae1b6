"""`streamkit produce`: JSON lines through the layout-aware producer, every record where
the topic's layout places its key (none in reserved capacity), bad lines named."""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson
from typer.testing import CliRunner

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from streamkit.cli import app as cli
from streamkit.testing import read_topic


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
