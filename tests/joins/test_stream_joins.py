"""Windowed stream-stream joins (inner, left, outer) in real worker processes on the real
broker, against the pairs computed here: every view and click of a user whose times
differ by at most 5 s, once; for left and outer joins each record that met none, once
its buffer closes. Timestamps are out of order within each topic (by less than the
grace). The same output after kill -9 at random moments, when the second half of the
input meets buffers rebuilt from the input on a fresh state directory, and through
processor scaling 2 -> 3 while both topics are written and 3 -> 2 after the last record."""

from __future__ import annotations

import asyncio
import random
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from streamkit.testing import aproduce_json, create_topic, default_partition, produce_json, read_topic
from tests.joins.join_app import GRACE, WITHIN
from tests.runtime.jobs import Job, wait_for_log, wait_until_committed

USERS, PER_TOPIC, SPREAD_MS, DISORDER_MS = 40, 500, 600_000, 2_000
T0 = 1_700_000_000_000
assert DISORDER_MS < GRACE * 1000  # no record is late: which pairs meet depends on no arrival order
Pair = tuple[str, Any, Any]


def _side(rng: random.Random, prefix: str) -> list[tuple[str, Any, None, int]]:
    """Records in time order but for a shuffle of up to DISORDER_MS."""
    stamps = sorted(T0 + rng.randrange(SPREAD_MS) for _ in range(PER_TOPIC))
    jittered = sorted(range(PER_TOPIC), key=lambda i: stamps[i] + rng.randrange(DISORDER_MS))
    return [(f"u{rng.randrange(USERS)}", {"id": f"{prefix}{i}"}, None, stamps[i]) for i in jittered]


def _sentinels(prefix: str) -> list[tuple[str, Any, None, int]]:
    """One far-future view per partition: every processor's stream time closes every buffer."""
    keys = {}
    n = 0
    while len(keys) < 2:
        key = f"end-{n}"
        keys.setdefault(default_partition(key.encode(), 2), key)
        n += 1
    return [(k, {"id": f"{prefix}-{k}"}, p, T0 + 10 * SPREAD_MS) for p, k in sorted(keys.items())]


def _reference(views: list[Any], clicks: list[Any]) -> dict[str, set[Pair]]:
    within = int(WITHIN * 1000)
    pairs = {
        (v[0], v[1]["id"], c[1]["id"])
        for v in views for c in clicks
        if v[0] == c[0] and abs(v[3] - c[3]) <= within
    }  # fmt: skip
    met_views = {view for _, view, _ in pairs}
    met_clicks = {click for _, _, click in pairs}
    lone_views = {(v[0], v[1]["id"], None) for v in views if v[1]["id"] not in met_views}
    lone_clicks = {(c[0], None, c[1]["id"]) for c in clicks if c[1]["id"] not in met_clicks}
    return {"inner": pairs, "left": pairs | lone_views, "outer": pairs | lone_views | lone_clicks}


def _topics(broker: str, tag: str) -> tuple[str, str, str]:
    """The views and clicks topics, and the prefix of the joins' output topics (created)."""
    out = f"joined-{tag}"
    for how in ("inner", "left", "outer"):
        create_topic(broker, f"{out}-{how}", 2)
    return create_topic(broker, f"views-{tag}", 2), create_topic(broker, f"clicks-{tag}", 2), out


def _outputs(broker: str, out: str) -> dict[str, set[Pair]]:
    seen: dict[str, set[Pair]] = {}
    for how in ("inner", "left", "outer"):
        got = set()
        for r in read_topic(broker, f"{out}-{how}"):
            value = orjson.loads(r.value)
            if not r.key.decode().startswith("end-"):
                got.add((r.key.decode(), value["view"], value["click"]))
        seen[how] = got
    return seen


def test_views_and_clicks_join_within_five_seconds_through_kills_and_a_rebuild(broker: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    views_topic, clicks_topic, out = _topics(broker, tag)
    rng = random.Random(21)
    views, clicks = _side(rng, "v"), _side(rng, "c")
    half = PER_TOPIC // 2
    job = Job(broker, f"join-{tag}", views_topic, tmp_path / "state", processors=2, app_spec="tests.joins.join_app:app")
    # no changelog: the fresh state directory below is rebuilt from the input
    env = {"SK_TEST_CLICKS": clicks_topic, "SK_TEST_OUT": out, "STREAMKIT_CHANGELOG": "false"}

    # 1. the first half of each topic, with kill -9 at two random moments on the way
    produce_json(broker, views_topic, views[:half])
    produce_json(broker, clicks_topic, clicks[:half])
    job.kill_at_random_moments(rng, 2, half, **env)
    worker = job.start_worker(**env)
    try:
        wait_for_log(job, worker, "hosts processors")  # (the killed ones may have applied everything)
        wait_until_committed(job, 2, half)
        wait_until_committed(job, 2, half, topic=clicks_topic)
    finally:
        job.stop_all()

    # 2. the second half, and the far-future views that close every buffer, meet buffers
    #    rebuilt from the input on a fresh state directory
    shutil.rmtree(job.state_dir)
    produce_json(broker, views_topic, [*views[half:], *_sentinels("v")])
    produce_json(broker, clicks_topic, clicks[half:])
    worker = job.start_worker(**env)
    try:
        wait_for_log(job, worker, "hosts processors")
        assert "rebuilt from" in job.log(worker)
        wait_until_committed(job, 2, PER_TOPIC + 2)
        wait_until_committed(job, 2, PER_TOPIC, topic=clicks_topic)
        expected = _reference(views, clicks)
        seen = _wait_for_outputs(broker, out, expected)
    finally:
        job.stop_all()
    _compare(expected, seen)
    assert len(expected["inner"]) > 100 and len(expected["outer"]) > len(expected["left"]) > len(expected["inner"])


def _wait_for_outputs(broker: str, out: str, expected: dict[str, set[Pair]]) -> dict[str, set[Pair]]:
    """The outputs once they equal ``expected`` or 30 s passed (the last buckets' closes
    are sent after the commit that the test waits for)."""
    deadline = time.monotonic() + 30
    while (seen := _outputs(broker, out)) != expected and time.monotonic() < deadline:
        time.sleep(0.3)
    return seen


def _compare(expected: dict[str, set[Pair]], seen: dict[str, set[Pair]], dead: list[str] | None = None) -> None:
    for how in ("inner", "left", "outer"):
        missing, extra = expected[how] - seen[how], seen[how] - expected[how]
        assert not missing and not extra, (
            f"{how}: {len(missing)} missing {sorted(missing, key=str)[:5]}, "
            f"{len(extra)} extra {sorted(extra, key=str)[:5]}; dead letters: {(dead or [])[:5]}"
        )


def test_joins_hold_through_processor_scaling_under_load(broker: str, tmp_path: Path) -> None:
    """Two workers, 2 -> 3 processors while views and clicks are written, then 3 -> 2
    after the last record: the buffers move with their keys (a shared task at 3), and the
    output is still exactly the pairs, the lone records included."""
    tag = uuid.uuid4().hex[:8]
    views_topic, clicks_topic, out = _topics(broker, tag)
    rng = random.Random(5)
    views, clicks = _side(rng, "v"), _side(rng, "c")
    job = Job(broker, f"join-{tag}", views_topic, tmp_path / "state", processors=2, app_spec="tests.joins.join_app:app")
    env = {"SK_TEST_CLICKS": clicks_topic, "SK_TEST_OUT": out}
    thirds = [PER_TOPIC // 3 * i for i in range(4)]
    thirds[3] = PER_TOPIC

    def produce(i: int) -> None:
        part = slice(thirds[i], thirds[i + 1])
        asyncio.run(_produce_in_time_order(broker, [(views_topic, views[part]), (clicks_topic, clicks[part])]))

    produce(0)
    job.start_worker(**env)
    job.start_worker(**env)
    try:
        wait_until_committed(job, 2, thirds[1])
        with ThreadPoolExecutor(1) as pool:  # written while the job scales
            writing = pool.submit(produce, 1)
            said = job.scale(3, **env)
            writing.result()
        produce(2)
        produce_json(broker, views_topic, _sentinels("v"))
        wait_until_committed(job, 2, PER_TOPIC + 2)
        wait_until_committed(job, 2, PER_TOPIC, topic=clicks_topic)
        # the shrink after the last record: partition 0's far-future view went to processor
        # 2, which closed its own keys' buffers; processor 0's stay open until it takes
        # processor 2's keys over and goes live with the larger stream time
        assert lh_bucket(key_hash(_sentinels("v")[0][0].encode()), 2, 3) == 2
        said += job.scale(2, **env)
        expected = _reference(views, clicks)
        seen = _wait_for_outputs(broker, out, expected)
    finally:
        job.stop_all()
    assert "processor 2: takes over the keys of processor 0" in said, said
    assert "processor 2: retires" in said, said
    _compare(expected, seen, _dead_letters(broker, job.app))


FLUSH_SPAN_MS = 3_000
FLUSH_PACE_SECONDS = 0.05
"""A live producer's pace: a third of the input takes about 3 s to write, over the
scaling step that the test runs beside it."""


async def _produce_in_time_order(broker: str, sides: list[tuple[str, list[Any]]]) -> None:
    """Write both topics as live producers would: merged by time, each topic keeping its
    own (jittered) order, acknowledged every ``FLUSH_SPAN_MS`` of event time and paced.

    Why: a record that a fetch may still not bring is at most one flush ahead of the
    others, so no record is late by the input alone (span + disorder < within + grace),
    whatever the idle wait decided; written a topic at a time in large chunks, the first
    topic's chunk may run far ahead of the second's once that one's idle wait has passed
    (as in Kafka Streams, whose deadline holds a quiet topic back only once)."""
    assert FLUSH_SPAN_MS + DISORDER_MS < (WITHIN + GRACE) * 1000
    merged: list[tuple[int, int, str, Any]] = []  # (running max of the topic's stamps, seq, topic, record)
    for topic, records in sides:
        high = 0
        for record in records:
            high = max(high, record[3])
            merged.append((high, len(merged), topic, record))
    merged.sort(key=lambda m: (m[0], m[1]))
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        while merged:
            end = next((n for n, m in enumerate(merged) if m[0] - merged[0][0] > FLUSH_SPAN_MS), len(merged))
            flush, merged = merged[:end], merged[end:]
            for topic, _ in sides:
                await aproduce_json(broker, topic, [m[3] for m in flush if m[2] == topic], producer=producer)
            await asyncio.sleep(FLUSH_PACE_SECONDS)
    finally:
        await producer.stop()


def _dead_letters(broker: str, app: str) -> list[str]:
    """The dead letters' keys and headers (what a failing comparison shows)."""
    try:
        return [f"{r.key!r} {dict(r.headers or ())}" for r in read_topic(broker, f"{app}-dead-letters")]
    except Exception as exc:  # noqa: BLE001 - no dead letter topic: none
        return [f"({exc})"]
