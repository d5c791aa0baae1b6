"""What a worker skips on purpose is visible: in its heartbeat (``skipped``), in `status`
(a "skipped on purpose" line, and ``skipped`` in ``--json``) and in its metrics
(``streamkit_records_skipped_total``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import streamkit
from streamkit.broker import EmbeddedBroker
from streamkit.cli.status import skipped_line
from streamkit.cli.status_view import StatusView, skipped
from streamkit.internal_records import Malformed
from streamkit.kafkaio import KafkaIO
from streamkit.ops.metrics import Durations, WorkerCollector, WorkerView
from streamkit.runtime.progress import PROGRESS_TOPIC
from streamkit.runtime.status import SKIPPED_KINDS, WorkerStatus, parse_status, skipped_counts
from streamkit.testing import create_topic, produce_json
from streamkit.windows import Hopping
from tests.ports import listen_port
from tests.runtime.jobs import ROOT, Job, make_records, wait_until_committed


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    """A broker of this module's own: the garbage its tests write into the internal topics
    must not reach the other tests' commands (they would warn of it on stderr)."""
    with EmbeddedBroker() as own:
        yield own.bootstrap


SKIPPED = {
    "malformed": {PROGRESS_TOPIC: 2},
    "copies": {"orders/0": 3, "orders/1": 1},
    "duplicate_strays": {"orders/2": 1},
}


def _status(**fields: Any) -> WorkerStatus:
    return WorkerStatus("app", "w1", 1, "host", time.time(), True, {0: [("orders", 0)]}, **fields)


# ---------------------------------------------------------------------- pure


def test_a_heartbeat_with_skipped_round_trips() -> None:
    beat = _status(skipped=SKIPPED)
    assert parse_status(beat.encode()) == beat


def test_an_old_heartbeat_without_skipped_decodes() -> None:
    old = orjson.loads(_status().encode())
    del old["skipped"]
    assert parse_status(orjson.dumps(old)).skipped == {}


@pytest.mark.parametrize("bad", [1, [1], {"malformed": 2}, {"copies": {"orders/0": "3"}}, {"copies": {"x": None}}])
def test_a_heartbeat_whose_skipped_has_another_shape_is_malformed(bad: Any) -> None:
    d = orjson.loads(_status().encode())
    d["skipped"] = bad
    with pytest.raises(Malformed, match="skipped"):
        parse_status(orjson.dumps(d))


class _Admission:
    def __init__(self, copies: dict[TopicPartition, int], duplicates: dict[TopicPartition, int]) -> None:
        self.copies_skipped_by = Counter(copies)
        self.duplicate_strays_by = Counter(duplicates)


def test_skipped_counts_sum_the_members_per_partition_and_leave_out_kinds_with_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("streamkit.runtime.status.malformed_counts", lambda: {})
    a = _Admission({TopicPartition("orders", 0): 2}, {})
    b = _Admission({TopicPartition("orders", 0): 1, TopicPartition("orders", 1): 1}, {TopicPartition("orders", 2): 1})
    assert skipped_counts([a, b]) == {"copies": {"orders/0": 3, "orders/1": 1}, "duplicate_strays": {"orders/2": 1}}
    assert skipped_counts([_Admission({}, {})]) == {}
    monkeypatch.setattr("streamkit.runtime.status.malformed_counts", lambda: {PROGRESS_TOPIC: 2})
    assert skipped_counts([a, b]) == SKIPPED


def test_status_shows_the_skipped_in_one_short_line_and_in_json() -> None:
    other = {"malformed": {PROGRESS_TOPIC: 1}, "copies": {"orders/1": 2}, "newer_kind": {"x": 1}}
    together = skipped([_status(skipped=SKIPPED), _status(skipped=other), _status()])
    # malformed: the most any worker skipped (each reads the same records); the others summed
    assert together == {
        "malformed": {PROGRESS_TOPIC: 2},
        "copies": {"orders/0": 3, "orders/1": 3},
        "duplicate_strays": {"orders/2": 1},
        "missed_windows": {},
        "failed_unmatched": {},
    }
    shown = StatusView("app", "g", "dl", 0.0, skipped=together)
    assert shown.as_dict()["skipped"] == together
    line = skipped_line(shown)
    assert line == (
        f"skipped on purpose: 2 malformed ({PROGRESS_TOPIC} 2), 6 copies (orders/0 3, orders/1 3), "
        "1 duplicate stray (orders/2 1)"
    )
    many = {"copies": {f"orders/{p}": 1 for p in range(12)}}
    assert skipped_line(StatusView("app", "g", "dl", 0.0, skipped=many)) == (
        "skipped on purpose: 12 copies (in 12 partitions)"
    )
    nothing = StatusView("app", "g", "dl", 0.0)
    assert skipped_line(nothing) is None
    assert nothing.as_dict()["skipped"] == {kind: {} for kind in SKIPPED_KINDS}


def _app_with_misses() -> streamkit.App:
    """An app with a hopping table and an outer join, each having counted what records
    missed (the windows and joins count them as they run: tests/windows, tests/joins)."""
    app = streamkit.App("misses")
    views, clicks = app.topic("views"), app.topic("clicks")
    per_minute = app.table("per_minute", window=Hopping(60, 20), default=int)
    app.table("totals", default=int)

    @app.join(views, clicks, within=5, how="outer")
    def seen(user: str, view: Any, click: Any, ctx: streamkit.Context) -> None: ...

    per_minute.missed.windows = 3
    app.joins["seen"].failed_unmatched = 2
    return app


def test_what_records_missed_shows_in_the_heartbeat_status_and_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("streamkit.runtime.status.malformed_counts", lambda: {})
    counts = skipped_counts([_Admission({}, {})], _app_with_misses())
    assert counts == {"missed_windows": {"per_minute": 3}, "failed_unmatched": {"seen": 2}}
    assert skipped_counts([_Admission({}, {})], streamkit.App("none")) == {}
    beat = _status(skipped=counts)
    assert parse_status(beat.encode()) == beat
    shown = StatusView("app", "g", "dl", 0.0, skipped=skipped([beat, beat]))
    assert skipped_line(shown) == (
        "skipped on purpose: 6 closed windows missed by late records (per_minute 6), "
        "4 failed join calls for records that met nobody (seen 4)"
    )
    v = WorkerView("app", "w1", {}, {}, {}, {}, [], {}, [], {}, 0, 0, Durations(), Durations(), skipped=counts)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(lambda: v))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(generate_latest(registry).decode())
        for s in fam.samples
    }

    def labelled(**labels: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted({"app": "app", "worker": "w1", **labels}.items()))

    assert samples[("streamkit_windows_missed_total", labelled(table="per_minute"))] == 3
    assert samples[("streamkit_join_unmatched_failures_total", labelled(join="seen"))] == 2


def test_the_admission_counts_second_copies_of_forwarded_strays_per_partition() -> None:
    from streamkit.layout.strays import STRAY_HEADER
    from tests.runtime.test_admission import SEAL, TP, Rec, capacity_only, make, stamp

    layout = capacity_only()
    admission, _, _ = make(layout)
    headers = [(*stamp(layout), (STRAY_HEADER, SEAL.seal("orders", 3, o, b"k", b"1"))) for o in (10, 11, 10, 11, 12)]
    admission.admit(TP, [Rec("orders", 0, i, b"k", b"1", h) for i, h in enumerate(headers)])
    assert admission.stray_check.stray_copies_dropped == 2 and admission.duplicate_strays_by == {TP: 2}
    assert skipped_counts([admission])["duplicate_strays"] == {"orders/0": 2}


def _skipped_samples(text: str) -> dict[tuple[str, str, str, str], float]:
    """``streamkit_records_skipped_total`` in a scrape: per (worker, reason, topic, partition)."""
    return {
        (s.labels["worker"], s.labels["reason"], s.labels["topic"], s.labels["partition"]): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "streamkit_records_skipped_total"
    }


def test_the_metrics_count_the_skipped_by_reason() -> None:
    v = WorkerView("app", "w1", {}, {}, {}, {}, [], {}, [], {}, 0, 0, Durations(), Durations(), skipped=SKIPPED)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(lambda: v))
    assert _skipped_samples(generate_latest(registry).decode()) == {
        ("w1", "malformed", PROGRESS_TOPIC, ""): 2,
        ("w1", "copy", "orders", "orders/0"): 3,
        ("w1", "copy", "orders", "orders/1"): 1,
        ("w1", "duplicate-stray", "orders", "orders/2"): 1,
    }


# ---------------------------------------------------------------------- a real worker


async def _write_garbage_progress(broker: str, group: str) -> int:
    """One record streamkit did not write (not JSON) in the progress log; its offset."""
    async with KafkaIO(broker) as io:
        await io.create_topic(PROGRESS_TOPIC, 1, configs={"retention.ms": "-1", "retention.bytes": "-1"})
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all")
    await producer.start()
    try:
        meta = await producer.send_and_wait(PROGRESS_TOPIC, b"\x00\xffnot json {", key=group.encode(), partition=0)
        return int(meta.offset)
    finally:
        await producer.stop()


def _wait(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not so after {timeout} s"
        time.sleep(0.5)
    return found


def test_a_malformed_progress_record_shows_in_status_and_the_metrics(broker: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    topic = create_topic(broker, f"in-{tag}", 2)
    job = Job(broker, f"skipped-{tag}", topic, tmp_path / "state", 2)
    asyncio.run(_write_garbage_progress(broker, f"streamkit-{job.app}"))
    metrics = listen_port()
    records = make_records(100, 20)

    def status_json() -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, "-m", "streamkit.cli", "status", job.app_spec, "--json"],
            cwd=ROOT, env=job.env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        doc: dict[str, Any] = orjson.loads(proc.stdout)
        return doc

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as answer:
            return str(answer.read().decode())

    try:
        worker = job.start_worker(STREAMKIT_METRICS_PORT=str(metrics))
        produce_json(broker, topic, records)
        wait_until_committed(job, 2, len(records), timeout=60)
        doc = _wait("the malformed record in status --json", lambda: (d := status_json())["skipped"]["malformed"] and d)
        assert doc["skipped"]["malformed"].get(PROGRESS_TOPIC, 0) >= 1, doc["skipped"]
        assert set(doc["skipped"]) == set(SKIPPED_KINDS)
        samples = _skipped_samples(scrape())
        assert any(k[1:] == ("malformed", PROGRESS_TOPIC, "") and n >= 1 for k, n in samples.items()), samples
        table = subprocess.run(
            [sys.executable, "-m", "streamkit.cli", "status", job.app_spec],
            cwd=ROOT, env=job.env(COLUMNS="80"), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert table.returncode == 0, table.stdout + table.stderr
        assert "skipped on purpose:" in table.stdout and "malformed" in table.stdout, table.stdout
        job.stop_all()
        assert worker.returncode == 0, job.log(worker, 3000)
    finally:
        job.kill_all()
