"""A worker's Prometheus metrics, scraped by a real Prometheus server (Debian's
``prometheus``) and read back through its HTTP API, with a real worker process and the
real broker: records handled, lag, dead letters, checkpoints, processor states."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from streamkit.ops.metrics import METRICS
from streamkit.testing import create_topic, produce_json
from tests.ports import listen_port
from tests.runtime.jobs import Job, make_records
from tests.runtime.test_strays import wait_drained


def _wait(what: str, check: Callable[[], Any], timeout: float = 60.0, shown: Callable[[], Any] = str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"not seen within {timeout} s: {what} (last: {shown()})"
        time.sleep(0.5)
    return found


def _query(api: int, promql: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{api}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            doc = orjson.loads(answer.read())
    except OSError:  # the server is still starting
        return []
    return list(doc["data"]["result"])


def _value(api: int, promql: str) -> float | None:
    found = _query(api, promql)
    return float(found[0]["value"][1]) if found else None


def test_prometheus_scrapes_a_running_worker(
    broker: str, tmp_path: Path, system_tool: Callable[[str, str], str]
) -> None:
    prometheus = system_tool("prometheus", "prometheus")
    topic = create_topic(broker, f"metrics-{uuid.uuid4().hex[:8]}", 2)
    job = Job(broker, f"metrics-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", 2)
    metrics, api = listen_port(), listen_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs: [{{job_name: streamkit, static_configs: [{{targets: ['127.0.0.1:{metrics}']}}]}}]\n"
    )
    server = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{api}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    records = make_records(2000, 100)
    app = f'app="{job.app}"'
    try:
        # small batches: a scrape gets the loop between two batches of the slow burst below
        worker = job.start_worker(STREAMKIT_METRICS_PORT=str(metrics), STREAMKIT_MAX_BATCH_RECORDS="100")
        produce_json(broker, topic, [*records, ("bad", b"{not json")])
        wait_drained(job, capacity=2)
        # every metric of the operating guide's table is served (its HELP line, with or without samples)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        served = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")}
        assert {n.removesuffix("_total") for n in METRICS} <= {n.removesuffix("_total") for n in served}, served
        # and Prometheus has them: every record applied once, no lag left, the bad one dead-lettered
        applied = f"sum(streamkit_records_applied_total{{{app}}})"
        _wait(  # the bad record too: handed to the handler, then among the dead letters
            "every record handled, in Prometheus",
            lambda: _value(api, applied) == len(records) + 1,
            shown=lambda: (_query(api, f"streamkit_records_applied_total{{{app}}}"), _query(api, "up")),
        )
        lag = f"max(streamkit_partition_lag{{{app}}})"
        _wait("no lag", lambda: _value(api, lag) == 0)
        dead = f'streamkit_dead_letters_total{{{app},reason="value-decode"}}'
        _wait("the bad record among the dead letters", lambda: _value(api, dead) == 1)
        active = f'count(streamkit_processor_state{{{app},state="active"}})'
        _wait("both processors active", lambda: _value(api, active) == 2)
        checkpoints = f"sum(streamkit_checkpoint_seconds_count{{{app}}})"
        _wait("checkpoints counted", lambda: (_value(api, checkpoints) or 0) > 0)
        positions = _query(api, f"streamkit_partition_position{{{app}}}")
        assert sorted(int(p["metric"]["partition"]) for p in positions) == [0, 1], positions
        assert sum(float(p["value"][1]) for p in positions) == len(records) + 1
        # the stores hold the keys; the caches missed at least once per key (its first read)
        keys = _wait("the store's keys", lambda: _value(api, f'sum(streamkit_store_keys{{{app},table="stats"}})'))
        assert keys >= 100 * 0.5, keys  # RocksDB's estimate of the 100 keys (memtable and SST files)
        assert (_value(api, f"sum(streamkit_store_bytes{{{app}}})") or 0) > 0
        misses = _value(api, f'sum(streamkit_cache_misses_total{{{app},table="stats"}})') or 0
        assert misses >= 100
        # new keys: the filter of stored keys answered misses without a store read
        spared = _value(api, f'sum(streamkit_store_reads_spared_total{{{app},table="stats"}})') or 0
        assert 0 < spared <= misses, (spared, misses)
        assert (_value(api, f'sum(streamkit_cache_entries{{{app},table="stats"}})') or 0) >= 100
        # paused while a burst of slow records arrives: the lag rises, then falls to 0
        burst = [(k, {**v, "slow_ms": 3}) for k, v in make_records(1500, 50, start=len(records))]
        assert _value(api, lag) == 0  # drained: what rises now is the burst's
        paused_at = time.monotonic()
        worker.send_signal(signal.SIGSTOP)
        try:
            produce_json(broker, topic, burst)
            time.sleep(1.0)  # paused for a while (well inside the session timeout)
        finally:
            worker.send_signal(signal.SIGCONT)
        _wait("every record of the burst applied", lambda: _value(api, applied) == len(records) + 1 + len(burst))
        _wait("no lag after the burst", lambda: _value(api, lag) == 0)
        since = int(time.monotonic() - paused_at) + 2
        peak = _value(api, f"max_over_time(max(streamkit_partition_lag{{{app}}})[{since}s:1s])")
        assert peak is not None and peak > len(burst) / 10, f"the lag rose to {peak} only during the burst"
    finally:
        job.stop_all()
        server.terminate()
        server.wait(30)
    assert worker.returncode == 0, job.log(worker, 3000)


def test_the_readme_lists_every_metric() -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs/guides/operating.md").read_text()
    assert [name for name in METRICS if f"| `{name}` |" not in readme] == []
