"""Records streamkit did not write, in its internal topics, are skipped: nothing stops.

A plain Kafka producer can write anything into ``__streamkit_progress``, ``__streamkit_jobs``,
``__streamkit_status``, ``__streamkit_layouts`` and ``__streamkit_layout_acks``. Each reader
decodes through ``streamkit.internal_records.decode_guarded``: a malformed record is skipped,
counted and logged once as topic[partition]@offset, and what well-formed records say stands.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from streamkit.broker import EmbeddedBroker
from streamkit.internal_records import Malformed, decode_guarded, malformed_counts
from streamkit.kafkaio import FetchedRecord, KafkaIO
from streamkit.layout.control import decode_control, ensure_acks_topic
from streamkit.layout.model import TopicLayout
from streamkit.layout.registry import ACKS_TOPIC, LAYOUTS_TOPIC, LayoutRegistry, decode_layout_record
from streamkit.layout.registry import encode_layout_record as encode_layout
from streamkit.producer import Producer
from streamkit.runtime.jobmeta import JOBS_TOPIC, JobLayout, newest_jobs
from streamkit.runtime.progress import PROGRESS_TOPIC, Commit, ProgressLog, decode_progress
from streamkit.runtime.status import STATUS_TOPIC, parse_status
from streamkit.testing import create_topic, produce_json
from tests.runtime.jobs import ROOT, Job, make_records, read_state, reference, wait_until_committed


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    """A broker of this module's own: the garbage its tests write into the internal topics
    must not reach the other tests' commands (they would warn of it on stderr)."""
    with EmbeddedBroker() as own:
        yield own.bootstrap


NOT_JSON = b"\x00\xffnot json {"

# A layout record of a topic nobody uses, whose seals are not objects (what stopped every worker).
SEALS_OF_INTS = orjson.dumps(
    {"v": 1, "layout": {"topic": "x", "n0": 1, "active": 1, "physical": 1, "modes": [0], "epoch": 1, "seals": [1]}}
)


def garbage(group: str, app: str, topic: str) -> dict[str, list[tuple[bytes, bytes]]]:
    """(key, value) records streamkit did not write, per internal topic."""
    other = f"unrelated-{uuid.uuid4().hex[:8]}".encode()
    half_progress = {"gen": 99, "member": "m", "parts": [[topic, 0, 10**9]], "shares": [1]}  # would half apply
    return {
        PROGRESS_TOPIC: [
            (group.encode(), NOT_JSON),
            (group.encode(), b"[1]"),
            (group.encode(), orjson.dumps({"gen": "x", "parts": 1})),
            (group.encode(), orjson.dumps(half_progress)),
            (group.encode(), orjson.dumps({"reset": "yes"})),
        ],
        JOBS_TOPIC: [
            (app.encode(), NOT_JSON),
            (other, NOT_JSON),
            (app.encode(), b"[1]"),
            (app.encode(), orjson.dumps({"processors": "two", "epoch": 99})),
            (b"\xff\xfe", orjson.dumps({"processors": 1})),
        ],
        STATUS_TOPIC: [
            (app.encode(), NOT_JSON),
            (other, b"[1]"),
            (app.encode(), orjson.dumps({"app": app, "worker": "w", "processors": 1})),
        ],
        LAYOUTS_TOPIC: [
            (other, SEALS_OF_INTS),
            (b"x", b"[1]"),
            (topic.encode(), NOT_JSON),
            (topic.encode(), orjson.dumps({"v": 1, "layout": {"topic": topic, "n0": "1", "seals": {}}})),
        ],
        ACKS_TOPIC: [
            (b"p", b"[1]"),
            (b"p", NOT_JSON),
            (b"p", orjson.dumps({"type": "ack", "producer": "p", "topic": topic, "ends": [1]})),
            (b"p", orjson.dumps({"type": "hb", "producer": "p", "lease_ms": "long"})),
        ],
    }


async def write_garbage(broker: str, records: dict[str, list[tuple[bytes, bytes]]]) -> dict[str, list[int]]:
    """Write ``records`` with a plain producer (the topics created as streamkit creates them);
    the offsets they got, per topic."""
    async with KafkaIO(broker) as io:
        await io.create_topic(PROGRESS_TOPIC, 1, configs={"retention.ms": "-1", "retention.bytes": "-1"})
        await io.create_topic(JOBS_TOPIC, 1)
        await io.create_topic(STATUS_TOPIC, 1)
        await LayoutRegistry(broker, io=io).start()
        await ensure_acks_topic(io)
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all")
    await producer.start()
    try:
        offsets: dict[str, list[int]] = {}
        for topic, recs in records.items():
            for key, value in recs:
                meta = await producer.send_and_wait(topic, value, key=key, partition=0)
                offsets.setdefault(topic, []).append(meta.offset)
        return offsets
    finally:
        await producer.stop()


def cli(job: Job, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamkit.cli", *args], cwd=ROOT, env=job.env(), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def test_a_worker_its_restart_and_status_go_on_through_garbage_in_every_internal_topic(
    broker: str, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    topic = create_topic(broker, f"in-{tag}", 3)
    job = Job(broker, f"garbage-{tag}", topic, tmp_path / "state", 2)
    group = f"streamkit-{job.app}"
    written = asyncio.run(write_garbage(broker, garbage(group, job.app, topic)))
    first, more = make_records(300, 40), make_records(200, 40, start=300)
    try:
        worker = job.start_worker()
        produce_json(broker, topic, first)
        wait_until_committed(job, 3, len(first), timeout=60)
        job.stop_all()
        assert worker.returncode == 0, job.log(worker, 3000)
        state, _ = read_state(job, 2)
        assert state == reference(first)  # every good record applied exactly once

        # More garbage while it is down, then a restart goes on from where it stopped.
        written2 = asyncio.run(write_garbage(broker, garbage(group, job.app, topic)))
        produce_json(broker, topic, more)
        worker = job.start_worker()
        wait_until_committed(job, 3, len(first) + len(more), timeout=60)

        status = cli(job, "status", job.app_spec)
        assert status.returncode == 0, status.stdout + status.stderr
        assert job.app in status.stdout and "processor" in status.stdout.lower()
        job.stop_all()
        assert worker.returncode == 0, job.log(worker, 3000)
    finally:
        job.kill_all()
    state, _ = read_state(job, 2)
    assert state == reference(first + more)

    # Each skipped record is said once, as topic[partition]@offset with why.
    log = "".join(job.log(w) for w in job.workers)
    at = written2[PROGRESS_TOPIC][0]
    assert re.search(rf"skipping a malformed record in {PROGRESS_TOPIC}\[0\]@{at}: not JSON", log), log[-3000:]
    assert f"{PROGRESS_TOPIC}[0]@{written[PROGRESS_TOPIC][3]}: shares is not a list of" in log
    assert f"{LAYOUTS_TOPIC}[0]@{written[LAYOUTS_TOPIC][0]}: layout: seals is not a list of objects" in log
    assert log.count(f"{PROGRESS_TOPIC}[0]@{at}:") == 1


def test_topics_describe_expand_and_the_producer_go_on_through_garbage(broker: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    topic = f"laid-{tag}"
    job = Job(broker, f"garbage-cli-{tag}", topic, tmp_path / "state", 1)
    created = cli(job, "topics", "create", topic, "--partitions", "2", "--capacity", "4", "--broker", broker)
    assert created.returncode == 0, created.stdout + created.stderr
    asyncio.run(write_garbage(broker, garbage(f"streamkit-{job.app}", job.app, topic)))

    described = cli(job, "topics", "describe", topic, "--broker", broker)
    assert described.returncode == 0, described.stdout + described.stderr
    assert topic in described.stdout
    expanded = cli(job, "topics", "expand", topic, "--partitions", "3", "--broker", broker)
    assert expanded.returncode == 0, expanded.stdout + expanded.stderr
    assert "sealed" in (expanded.stdout + expanded.stderr)

    async def produce_and_check() -> None:
        async with LayoutRegistry(broker) as reg:
            layout = await reg.load(topic)
            assert layout.active == 3 and layout.physical == 4  # the garbage for it changed nothing
        async with Producer(broker, client_id=f"p-{tag}") as p:
            sent = [await p.send(topic, f"k{i}", {"i": i}) for i in range(20)]
            await p.flush()
            assert {(await d).partition for d in sent} <= {0, 1, 2}

    asyncio.run(produce_and_check())


def test_a_malformed_layout_record_of_a_topic_keeps_its_good_layout(broker: str) -> None:
    topic = f"kept-{uuid.uuid4().hex[:8]}"
    layout = TopicLayout.from_dict(
        {"topic": topic, "n0": 2, "active": 2, "physical": 4, "modes": [0, 0, -1, -1], "epoch": 1}
    )

    async def go() -> None:
        key, value = encode_layout(layout, by="test")
        await write_garbage(broker, {LAYOUTS_TOPIC: [(key, value)]})
        bad = orjson.dumps({"v": 1, "layout": {**layout.to_dict(), "epoch": 2, "seals": [1]}})
        offsets = await write_garbage(broker, {LAYOUTS_TOPIC: [(key, bad), (key, NOT_JSON), (key, b"[1]")]})
        async with LayoutRegistry(broker) as reg:
            assert await reg.load(topic) == layout
            malformed = {r.offset for r in reg.refusals if r.topic == topic and r.reason.startswith("malformed")}
            assert set(offsets[LAYOUTS_TOPIC]) <= malformed

    asyncio.run(go())
    assert malformed_counts().get(LAYOUTS_TOPIC, 0) >= 3


def test_the_progress_log_skips_a_record_that_would_apply_half_way(broker: str) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        async with KafkaIO(broker) as io:
            producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all")
            await producer.start()
            try:
                log = ProgressLog(io, producer, group)
                await log.start()
                await log.record("m1", 3, {}, Commit({("t", 0): 7}))
                await write_garbage(broker, garbage(group, "app", "t"))
                await log.refresh()
                assert log.position("t", 0) == 7 and log.newest_generation([("t", 0)]) == 3
                await log.record("m1", 3, {}, Commit({("t", 0): 9}))
                assert log.position("t", 0) == 9
            finally:
                await producer.stop()

    asyncio.run(go())


# ---------------------------------------------------------------------- the pure decoders


def _rec(topic: str, value: bytes, offset: int = -1) -> FetchedRecord:
    return FetchedRecord(topic, 0, offset, 0, b"k", value, ())


DECODERS: dict[str, Callable[[bytes], Any]] = {
    PROGRESS_TOPIC: decode_progress,
    JOBS_TOPIC: partial(JobLayout.from_json, "app"),
    STATUS_TOPIC: parse_status,
    LAYOUTS_TOPIC: decode_layout_record,
    ACKS_TOPIC: decode_control,
}

GOOD: dict[str, bytes] = {
    PROGRESS_TOPIC: orjson.dumps(
        {
            "group": "g",
            "member": "m",
            "gen": 2,
            "epochs": {},
            "parts": [["t", 0, 5], ["t", 1, None]],
            "shares": [["t", 2, 0, 4, [0, 1]]],
            "swept": [["t", 0]],
            "st": [["t", 0, 100]],
            "sweep_ends": [["t", 0, 3, 4]],
            "copies_after": [["t", 0, [[0, 1], [1, 2]]]],
        }
    ),  # fmt: skip
    JOBS_TOPIC: JobLayout("app", 2, 3, 4, None, "me", ("t",), "inc").to_json(),
    STATUS_TOPIC: orjson.dumps(
        {
            "app": "app",
            "worker": "w",
            "pid": 1,
            "host": "h",
            "at": 1.5,
            "alive": True,
            "processors": {"0": [["t", 0]]},
            "joining": {"1": {"lag": 3}},
            "changelog": {"0": [5, 1]},
            "dead_letters": {"x": 1},
        }
    ),  # fmt: skip
    LAYOUTS_TOPIC: encode_layout(
        TopicLayout.from_dict({"topic": "t", "n0": 2, "active": 2, "physical": 4, "modes": [0, 0, -1, -1], "epoch": 1}),
        by="me",
    )[1],
    ACKS_TOPIC: orjson.dumps(
        {"v": 1, "type": "ack", "producer": "p", "topic": "t", "epoch": 2, "change_id": "c", "ends": {"0": 5}, "ts": 1}
    ),  # fmt: skip
}


def test_well_formed_records_decode() -> None:
    for topic, value in GOOD.items():
        assert decode_guarded(_rec(topic, value), partial(DECODERS[topic], value)) is not None, topic
    status = parse_status(GOOD[STATUS_TOPIC])
    assert status.processors == {0: [("t", 0)]} and status.changelog == {0: [5, 1]}


@pytest.mark.parametrize(
    ("topic", "value", "why"),
    [
        (PROGRESS_TOPIC, NOT_JSON, "not JSON"),
        (PROGRESS_TOPIC, b"[1]", "the record is not an object"),
        (PROGRESS_TOPIC, b'{"gen": 1, "member": "m", "parts": [["t", "0", 1]]}', "parts is not a list of"),
        (JOBS_TOPIC, b'{"processors": "2"}', "processors is not int"),
        (STATUS_TOPIC, b'{"app": "a", "processors": {}}', "worker is missing"),
        (LAYOUTS_TOPIC, SEALS_OF_INTS, "seals is not a list of objects"),
        (ACKS_TOPIC, b"[1]", "the record is not an object"),
        (ACKS_TOPIC, b'{"type": "ack", "producer": "p", "topic": "t", "ends": [1]}', "ends is not"),
    ],
)
def test_a_malformed_record_is_skipped_and_said_with_why(
    topic: str, value: bytes, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    offset = random.randrange(10**12, 10**13)  # a fresh offset: said once
    before = malformed_counts().get(topic, 0)
    with caplog.at_level("WARNING", logger="streamkit.internal"):
        assert decode_guarded(_rec(topic, value, offset), partial(DECODERS[topic], value)) is None
        assert decode_guarded(_rec(topic, value, offset), partial(DECODERS[topic], value)) is None  # read again
    said = [r.getMessage() for r in caplog.records if f"{topic}[0]@{offset}" in r.getMessage()]
    assert len(said) == 1 and why in said[0], said
    assert malformed_counts()[topic] == before + 1


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, 1, -1, 2**40, rng.randrange(-100, 100)])
    if kind == 3:
        return rng.random() * 100
    if kind == 4:
        return rng.choice(["", "t", "0", "ack", "hb", "x" * rng.randrange(5)])
    if kind == 5:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["gen", "member", "parts", "shares", "ic", "processors", "p", "epoch", "app", "worker", "layout",
            "seals", "type", "producer", "topic", "ends", "reset", "n0", "modes", "active", "physical"]  # fmt: skip
    return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randrange(6))}


def _mutations(rng: random.Random, good: bytes) -> bytes:
    """Random bytes, random JSON, or a well-formed record with one field replaced."""
    pick = rng.randrange(3)
    if pick == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
    if pick == 1:
        return orjson.dumps(_random_json(rng))
    d = orjson.loads(good)
    target = d["layout"] if "layout" in d and rng.random() < 0.7 else d
    if target:
        target[rng.choice(sorted(target))] = _random_json(rng)
    return orjson.dumps(d)


def test_fuzz_the_decoders_never_raise_through_the_guard() -> None:
    """Random bytes and random JSON shapes into every decoder: the guard answers a value or
    None, never an exception. More cases with STREAMKIT_FUZZ_CASES."""
    cases = int(os.environ.get("STREAMKIT_FUZZ_CASES", "300"))
    start = int(os.environ.get("STREAMKIT_FUZZ_START", random.randrange(2**32)))
    rng = random.Random(start)
    for case in range(cases):
        for topic, decode in DECODERS.items():
            value = _mutations(rng, GOOD[topic])
            try:
                decode_guarded(_rec(topic, value), partial(decode, value))
            except Exception as exc:  # pragma: no cover - what the test is for
                pytest.fail(f"STREAMKIT_FUZZ_START={start} case {case} {topic} {value!r}: {exc!r}")


def test_newest_jobs_skip_malformed_records_and_keep_the_good_one() -> None:
    good = JobLayout("a", 2, 2, 3, None, "me", (), "inc")
    recs = [
        FetchedRecord(JOBS_TOPIC, 0, 0, 0, b"a", good.to_json(), ()),
        FetchedRecord(JOBS_TOPIC, 0, 1, 0, b"a", NOT_JSON, ()),
        FetchedRecord(JOBS_TOPIC, 0, 2, 0, b"a", b'{"processors": 0, "epoch": 9}', ()),
        FetchedRecord(JOBS_TOPIC, 0, 3, 0, b"\xff", good.to_json(), ()),
    ]
    assert newest_jobs(recs) == {"a": good}
    with pytest.raises(Malformed):
        JobLayout.from_json("a", b'{"processors": 2, "topics": [1]}')
