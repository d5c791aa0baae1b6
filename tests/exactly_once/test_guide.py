"""The exactly-once guide's example (docs/guides/exactly-once.md), run as written: a real
worker process of it against the broker and a real PostgreSQL server, orders in, the
totals in the table and in the output topic, exactly once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from streamkit.exactly_once.markers import ATTEMPT_HEADER
from streamkit.testing import create_topic
from tests.docs.blocks import ROOT, page_blocks

PAGE = "docs/guides/exactly-once.md"


def test_the_guides_app_writes_each_total_once(
    broker: str, topic_factory: Callable[..., str], produce: Callable[..., int], read_all: Callable[..., list],
    postgres: str, tmp_path: Path,
) -> None:  # fmt: skip
    [block] = [b for b in page_blocks(ROOT / PAGE) if b.label == "guide"]
    run = topic_factory(1, prefix="guide").rsplit("-", 1)[-1]
    code = block.code.replace('"order-totals"', f'"order-totals-{run}"').replace('"orders"', f'"orders-{run}"')
    (tmp_path / "guide_app.py").write_text(code)
    for name in (f"orders-{run}", f"order-totals-{run}"):  # the app's topics, named for this run
        create_topic(broker, name, 2)
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS totals; CREATE TABLE totals (customer text PRIMARY KEY, total bigint)")
    produce(f"orders-{run}", [(c, {"amount": a}) for c, a in [("ann", 5), ("bob", 7), ("ann", 3)]])
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}", "STREAMKIT_BROKER": broker, "TOTALS_DSN": postgres,
           "STREAMKIT_STATE_DIR": str(tmp_path / "state"), "STREAMKIT_COMMIT_INTERVAL": "0.3"}  # fmt: skip
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 - open while the worker runs
    worker = subprocess.Popen([sys.executable, "-m", "streamkit.cli", "worker", "guide_app:app"], cwd=tmp_path,
                              env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            with psycopg.connect(postgres) as conn:
                got = dict(conn.execute("SELECT customer, total FROM totals").fetchall())
            if got == {"ann": 8, "bob": 7}:
                break
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"{got}\n{(tmp_path / 'worker.log').read_text()[-3000:]}"
            time.sleep(0.2)
    finally:
        worker.terminate()
        worker.wait(30)
        log.close()
    sent = [r for r in read_all(f"order-totals-{run}") if r.value]
    assert sorted(r.value for r in sent) == [b'{"total":5}', b'{"total":7}', b'{"total":8}']
    assert all(any(h[0] == ATTEMPT_HEADER for h in r.headers) for r in sent)
