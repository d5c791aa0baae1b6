"""The backfill guide's walk-through (docs/guides/backfill.md), run as it stands (its commands
are read from the page, so the two cannot drift apart), then checked against totals
computed here from every record in Kafka."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
from test_spark_backfill import read_all

from streamkit.testing import read_topic

ROOT = Path(__file__).resolve().parents[2]


def guide_commands() -> str:
    text = (ROOT / "docs/guides/backfill.md").read_text()
    m = re.search(r"<!-- backfill-guide[^>]*-->\s*```bash\n(.*?)```", text, re.S)
    assert m is not None, "docs/guides/backfill.md lost its backfill-guide block"
    return m.group(1)


def test_readme_backfill_guide_gives_the_totals_of_the_whole_history(tmp_path: Path, fresh_broker: str) -> None:
    env = {
        **os.environ,
        "STREAMKIT_BROKER": fresh_broker,
        "PYTHONPATH": str(ROOT),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", guide_commands()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "-p purchases:0=" in run.stdout  # describe prints the ends as positions
    assert "consumer group streamkit-purchases" in run.stdout and "ReadWrite" in run.stdout  # status
    assert "rows read" in run.stdout and "30,000" in run.stdout
    # Spark's own output went to the log file, not to the terminal
    logs = list((tmp_path / ".streamkit" / "purchases" / "backfill-logs").glob("spark-*.log"))
    assert len(logs) == 1 and logs[0].stat().st_size > 0
    assert "org.apache" not in output and "log4j" not in output.lower()

    reference: dict[str, dict[str, int]] = {}
    records = read_topic(fresh_broker, "purchases")
    assert len(records) == 40_000
    for rec in records:
        assert rec.key is not None and rec.value is not None
        t = reference.setdefault(rec.key.decode(), {"purchases": 0, "amount": 0})
        t["purchases"] += 1
        t["amount"] += orjson.loads(rec.value)["amount"]
    stores = read_all(tmp_path / ".streamkit" / "purchases", ["spent"])
    assert sorted(stores) == [0, 1, 2, 3]  # p0 = the topic's 4 initial partitions, as a worker decides
    merged: dict[str, dict[str, int]] = {}
    for tables, _checkpoint in stores.values():
        for k, v in tables["spent"].items():
            assert k.decode() not in merged  # each customer on one processor
            merged[k.decode()] = orjson.loads(v)
    assert merged == reference
