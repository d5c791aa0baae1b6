"""One bad record never stops a job: a seeded fuzz of a running job.

Real worker processes read a topic with a layout while the test writes, between batches
of good records:

- records streamkit did not write into every internal topic (``__streamkit_progress``,
  ``__streamkit_jobs``, ``__streamkit_status``, ``__streamkit_layouts``,
  ``__streamkit_layout_acks``, ``__streamkit_seal``; not the changelog, whose records
  are state itself): random bytes, null and empty values and random JSON shapes, keyed
  by the job's group, app or topic, by unrelated names, by random bytes or by nothing;
- input records with good values carrying reserved headers (the stamp ``sk``, the
  stray origin ``streamkit.stray.from``, ``sk.copy``, the older epoch and producer
  headers) with random values, in random positions among unrelated headers.

The input topic has reserved capacity (2 active partitions of 3), so a plain producer's
records (the good ones of some batches, most of the hostile ones) include strays the
workers forward with a sealed origin. The workers are stopped, SIGKILLed and started
again on the way, so what lies in the internal topics is read again. At the end no
worker stopped on its own, ``status`` answers, and every input record is accounted for:
applied once by the processor owning its key (in the ``stats`` table) or a dead letter
with a reason, never silently dropped; no good record is a dead letter. A dead letter
said twice (by a worker SIGKILLed before its commit, and by its successor) counts once:
dead letters are output, at least once like any.

Not written, because they are commands rather than garbage: a well-formed record of the
job's own in an internal topic (a reset, a layout, a commit), a tombstone of the job's
key in ``__streamkit_jobs`` (``streamkit reset``), the seal's key in ``__streamkit_seal``.

Seeded: ``STREAMKIT_FUZZ_START`` replays a run (its value is in every failure message),
``STREAMKIT_FUZZ_ROUNDS`` (default 3) runs longer.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from assignors.linear_hashing import partition_for_key
from streamkit.broker import EmbeddedBroker
from streamkit.errors import TopicNotFoundError
from streamkit.kafkaio import KafkaIO
from streamkit.layout.model import TopicLayout
from streamkit.layout.registry import LayoutRegistry
from streamkit.layout.seal import SEAL_RECORD_KEY, SEAL_TOPIC, SEAL_TOPIC_CONFIGS
from streamkit.layout.stamps import COPY_HEADER, EPOCH_HEADER, PRODUCER_HEADER, STAMP_HEADER, record_epoch, stamp
from streamkit.layout.strays import STRAY_HEADER
from streamkit.producer import Producer
from streamkit.runtime.jobmeta import JOBS_TOPIC, JobLayout
from streamkit.runtime.progress import PROGRESS_TOPIC
from streamkit.testing import aproduce_json, produce_json, read_topic
from tests.runtime.jobs import Job, make_records, read_state, wait_for_log
from tests.runtime.test_internal_garbage import DECODERS, GOOD, _mutations, _random_json, garbage, write_garbage
from tests.runtime.test_strays import cli, layout_topic, wait_drained

ACTIVE, CAPACITY = 2, 3
"""The input topic's layout: partition 2 reserved, where a plain producer's records are strays
(forwarded by the workers with a sealed origin)."""
KEYS = 40
GOOD_PER_ROUND = 150
HOSTILE_PER_ROUND = 12
GARBAGE_PER_TOPIC = 4
OUR_TAG = b"a1b2c3"
"""A producer tag in stamps the test writes (a producer that never ran)."""


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    """A broker of this module's own: the garbage its test writes into the internal topics
    must not reach the other tests' commands (they would warn of it on stderr)."""
    with EmbeddedBroker() as own:
        yield own.bootstrap


Raw = tuple[bytes | None, bytes | None]
Hostile = tuple[str, dict[str, Any], list[tuple[str, bytes]], int | None]
"""An input record with reserved headers: key, value, headers, partition (None: Kafka's
default partitioner's, as a plain producer writes)."""


def _hostile_value(rng: random.Random, topic: str, names: list[str]) -> bytes | None:
    """Random bytes, nothing, or a random JSON shape (some naming the job)."""
    pick = rng.randrange(6)
    if pick == 0:
        return rng.choice([None, b""])  # a tombstone, an empty record
    if pick == 1:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 60)))
    if pick == 2:
        return _mutations(rng, GOOD[topic])  # random bytes, random JSON, a good record with a field replaced
    shape = _random_json(rng)
    if pick == 3 or not isinstance(shape, dict):
        return orjson.dumps(shape)
    for _ in range(rng.randrange(1, 4)):  # the job's names where names go, and junk where they do not
        field = rng.choice(["app", "group", "topic", "worker", "member", "producer", "layout", "parts", "gen"])
        shape[field] = rng.choice([*names, [rng.choice(names), 0, 1], {"topic": rng.choice(names)}, -1])
    return orjson.dumps(shape)


def internal_garbage(
    rng: random.Random, group: str, app: str, topic: str
) -> dict[str, list[Raw]]:  # fmt: skip
    """Per internal topic, records streamkit did not write: the fixed ones of
    ``test_internal_garbage`` and random ones. A value the topic's decoder takes for
    well-formed is written only under a key and with a value that name nothing of this
    job: a well-formed record of the job's own is a command (a reset, a layout), not
    garbage."""
    names = [group, app, topic]
    ours = {n.encode() for n in names}
    decoders: dict[str, Callable[[bytes], Any]] = {**DECODERS, JOBS_TOPIC: partial(JobLayout.from_json, app)}
    fixed = garbage(group, app, topic)
    out: dict[str, list[Raw]] = {t: list(recs) for t, recs in fixed.items()}
    out[SEAL_TOPIC] = []
    while len(out[SEAL_TOPIC]) < GARBAGE_PER_TOPIC:  # never a key of the seal's length under its record key
        key = rng.choice([SEAL_RECORD_KEY, b"unrelated", None, *ours])
        value = _hostile_value(rng, PROGRESS_TOPIC, names)
        if (key is not None or value is not None) and not (key == SEAL_RECORD_KEY and len(value or b"") == 32):
            out[SEAL_TOPIC].append((key, value))
    for t, decode in decoders.items():
        while len(out[t]) < len(fixed[t]) + GARBAGE_PER_TOPIC:
            key = rng.choice([*ours, *ours, b"unrelated", b"\xff\xfe", b"", None, topic.upper().encode()])
            value = _hostile_value(rng, t, names)
            if key is None and value is None:
                continue  # Kafka takes no record without both
            if t == JOBS_TOPIC and key == app.encode() and value is None:
                continue  # the job's tombstone: `streamkit reset` (the next start is a new incarnation)
            try:
                decode(cast(bytes, value))
            except Exception:  # noqa: BLE001 - malformed, whatever the decoder says: garbage
                out[t].append((key, value))
                continue
            if key not in ours and not any(n in (value or b"") for n in ours):
                out[t].append((key, value))  # well-formed, of nobody here
    return out


def reserved_headers(rng: random.Random, epoch: int, unknown_epoch: int) -> list[tuple[str, bytes]]:
    """One to four headers, at least one reserved, with random values, in random order."""
    choices: list[Callable[[], tuple[str, bytes]]] = [
        lambda: (STAMP_HEADER, rng.choice([
            stamp(OUR_TAG, epoch)[1], stamp(b"ffffff", 0)[1], stamp(b"0a0b0c", unknown_epoch)[1], b"junk", b"",
            b"ffffff", b"\xff" * 8, b"ab1234-5", b"%06d" % rng.randrange(10**6),
        ])),
        lambda: (STRAY_HEADER, rng.choice([
            b"0:1000", b"1:5", b"0:0", b"1:1000", b"0:1000:0123456789abcdef", b"junk", b"", b"-1:-1", b"0:1:2",
            b"%d:%d" % (rng.randrange(CAPACITY + 1), rng.randrange(10**6)),
        ])),
        lambda: (COPY_HEADER, rng.choice([b"0", b"1", b"2", b"junk", b"", b"-1"])),
        lambda: (EPOCH_HEADER, rng.choice([b"%d" % epoch, b"0", b"%d" % unknown_epoch, b"x", b""])),
        lambda: (PRODUCER_HEADER, rng.choice([b"p", b"", b"\xff\xfe", b"streamkit-0a0b0c"])),
    ]  # fmt: skip
    headers = [rng.choice(choices)() for _ in range(rng.randrange(1, 4))]
    if rng.random() < 0.4:
        headers.append(("x-trace", bytes(rng.randrange(256) for _ in range(rng.randrange(8)))))
    rng.shuffle(headers)
    return headers


async def ensure_seal_topic(broker: str) -> None:
    """The seal's topic, created as streamkit creates it (garbage goes in before its key)."""
    async with KafkaIO(broker) as io:
        await io.create_topic(SEAL_TOPIC, 1, configs=SEAL_TOPIC_CONFIGS)


def forged_origins(rng: random.Random, seq: int, epoch: int) -> list[Hostile]:
    """Two records of one key whose last header claims the same origin, unsealed or with a
    wrong seal: the second is no second copy of a forwarded stray (none was forwarded)."""
    key = f"k{rng.randrange(KEYS)}"
    origin = rng.choice([b"0:1000", b"1:5", b"0:0", b"0:1000:0123456789abcdef", b"1:7:"])
    before = [("x-trace", b"1")] if rng.random() < 0.5 else [stamp(OUR_TAG, epoch)]
    return [
        (key, {"amount": rng.randrange(1, 1000), "seq": seq - i}, [*before, (STRAY_HEADER, origin)], None)
        for i in (0, 1)
    ]


async def write_hostile(broker: str, topic: str, records: list[Hostile]) -> None:
    """Each record alone in its batch, with its own headers (through one producer)."""
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        for key, value, headers, partition in records:
            await aproduce_json(broker, topic, [(key, value, partition)], headers=headers, producer=producer)
    finally:
        await producer.stop()


async def produce_placed(broker: str, topic: str, records: list[tuple[str, dict[str, Any]]]) -> None:
    async with Producer(broker, client_id=f"fuzz-{uuid.uuid4().hex[:6]}") as producer:
        for key, value in records:
            await producer.send(topic, key, value)
        await producer.flush()


def load_layout(broker: str, topic: str) -> TopicLayout:
    async def go() -> TopicLayout:
        async with LayoutRegistry(broker) as reg:
            return await reg.load(topic)

    return asyncio.run(go())


def hostile_records(
    rng: random.Random, layout: TopicLayout, unknown_epoch: int, seq: int
) -> list[Hostile]:  # fmt: skip
    """This round's input records with reserved headers, their values' seqs from ``seq``
    down. Most lie where Kafka's default partitioner puts their keys (a plain producer's:
    over the physical partitions, so some are strays), some in a random partition. A
    record whose first header is a well-formed stamp of the current epoch lies where the
    layout places its key: the workers trust such a stamp (streamkit's producer placed the
    record by that layout: no check costs anything on its records) and check placement
    only for records stamped with another epoch, or not stamped."""
    out: list[Hostile] = []
    for _ in range(HOSTILE_PER_ROUND):
        key = rng.choice([f"k{rng.randrange(KEYS)}", f"h{rng.randrange(5)}"])
        value = {"amount": rng.randrange(1, 1000), "seq": seq - len(out)}
        out.append((key, value, reserved_headers(rng, layout.epoch, unknown_epoch), None))
    out += forged_origins(rng, seq - len(out), layout.epoch)
    placed = [
        (k, v, h, partition_for_key(k.encode(), layout.n0, layout.active) if trusted(h, layout.epoch) else None)
        for k, v, h, _ in out
    ]  # fmt: skip
    elsewhere = [p if p is not None or rng.random() >= 0.2 else rng.randrange(layout.physical) for *_, p in placed]
    return [(k, v, h, p) for (k, v, h, _), p in zip(placed, elsewhere, strict=True)]


def trusted(headers: list[tuple[str, bytes]], epoch: int) -> bool:
    """Whether the first header is a stamp of ``epoch`` (the current one): as streamkit's
    producer writes it."""
    return bool(headers) and headers[0][0] in (STAMP_HEADER, EPOCH_HEADER) and record_epoch(headers) == epoch


def test_no_bad_record_stops_a_job_and_every_record_is_applied_or_a_dead_letter(
    broker: str, tmp_path: Path
) -> None:  # fmt: skip
    start = int(os.environ.get("STREAMKIT_FUZZ_START", random.randrange(2**32)))
    rounds = max(2, int(os.environ.get("STREAMKIT_FUZZ_ROUNDS", "3")))
    replay = f"replay: STREAMKIT_FUZZ_START={start} STREAMKIT_FUZZ_ROUNDS={rounds}"
    print(replay)
    try:
        fuzz_a_job(broker, tmp_path, random.Random(start), rounds)
    except BaseException as exc:
        exc.add_note(replay)
        raise


def fuzz_a_job(broker: str, tmp_path: Path, rng: random.Random, rounds: int) -> None:
    topic = layout_topic(broker, ACTIVE, CAPACITY)
    job = Job(broker, f"fuzz-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", ACTIVE)
    group = f"streamkit-{job.app}"
    layout = load_layout(broker, topic)
    unknown_epoch = rng.choice([layout.epoch + 1, 999_999, 2**31])  # one per run: each costs the registry's wait
    written: Counter[str] = Counter()
    amounts: Counter[str] = Counter()
    hostile: list[Hostile] = []
    killed: list[Any] = []  # workers this test SIGKILLed (the others must stop only when asked)
    stopped: list[Any] = []  # workers this test stopped (SIGTERM) and that stopped cleanly
    kill_at = rng.randrange(1, rounds)

    def alive() -> list[Any]:
        return [w for w in job.workers if w.poll() is None]

    def start_worker() -> None:
        # a short wait for an epoch the registry never reaches: forged stamps cost seconds, not tens
        wait_for_log(job, job.start_worker(STREAMKIT_LAYOUT_EPOCH_WAIT="3"), "hosts processors")

    def no_worker_exited() -> None:
        gone = [w for w in job.workers if w.poll() is not None and w not in killed + stopped]
        assert not gone, "a worker exited: " + "\n".join(job.log(w, 3000) for w in gone)

    def of_key(key: str | None) -> list[Hostile]:
        return [r for r in hostile if r[0] == key]

    def ledger(records: list[tuple[str, dict[str, Any]]]) -> None:
        for k, v in records:
            written[k] += 1
            amounts[k] += v["amount"]

    try:
        asyncio.run(ensure_seal_topic(broker))  # garbage first, then the workers write the seal's key
        # (write_garbage's records are typed bytes; its producer takes null keys and values as well)
        asyncio.run(write_garbage(broker, cast(Any, internal_garbage(rng, group, job.app, topic))))
        start_worker()
        for r in range(rounds):
            no_worker_exited()
            good = make_records(GOOD_PER_ROUND, KEYS, start=r * GOOD_PER_ROUND)
            if rng.random() < 0.5:  # a plain producer's: partition 2's records are strays
                produce_json(broker, topic, good)
            else:  # streamkit's producer's: placed by the layout, stamped
                asyncio.run(produce_placed(broker, topic, good))
            ledger(good)

            asyncio.run(write_garbage(broker, cast(Any, internal_garbage(rng, group, job.app, topic))))

            batch = hostile_records(rng, layout, unknown_epoch, -1 - len(hostile))
            asyncio.run(write_hostile(broker, topic, batch))
            hostile += batch
            ledger([(k, v) for k, v, _, _ in batch])

            if r == kill_at:  # SIGKILL one worker mid-run; its successor reads the garbage again
                victim = rng.choice(alive())
                victim.kill()
                victim.wait()
                killed.append(victim)
                start_worker()
            elif len(alive()) < 2 and rng.random() < 0.5:
                start_worker()  # a second worker: a rebalance
            elif len(alive()) == 2 and rng.random() < 0.3:
                first = alive()[0]  # stopped and started again
                first.terminate()
                assert first.wait(30) == 0, job.log(first, 3000)
                stopped.append(first)
                start_worker()

        no_worker_exited()
        # only now: a worker's log file is named by how many were started before it
        job.workers[:] = alive()  # wait_drained fails on any worker not running
        wait_drained(job, capacity=CAPACITY, timeout=120)
        status = cli(job, "status", job.app_spec)
        assert status.returncode == 0, status.stdout + status.stderr
    finally:
        job.stop_all()
    gone = [w for w in job.workers if w.returncode != 0]
    assert not gone, "a worker exited: " + "\n".join(job.log(w, 3000) for w in gone)

    try:
        state, _ = read_state(job, ACTIVE)  # fails if a key is in two processors' stores
    except AssertionError as exc:  # applied by a processor that does not own it: which records could be
        split = re.search(r"key (\S+) is in two", str(exc))
        exc.add_note(f"hostile records of that key (key, value, headers, partition): {of_key(split and split[1])}")
        raise
    try:
        dead = read_topic(broker, f"{job.app}-dead-letters")
    except TopicNotFoundError:  # no dead letter was ever written
        dead = []
    dead_n: Counter[str] = Counter()
    dead_sum: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    sources: dict[tuple[bytes, bytes], list[tuple[str, int, str]]] = {}
    for d in dead:
        headers = dict(d.headers)
        why = headers.get("streamkit.error.reason", b"").decode()
        assert why, f"a dead letter without a reason: {d}"
        value = orjson.loads(d.value or b"null")
        assert value["seq"] < 0, f"a good record is a dead letter ({why}): {d}"
        key = (d.key or b"").decode()
        source = (headers.get("streamkit.source.partition", b""), headers.get("streamkit.source.offset", b""))
        sources.setdefault(source, []).append((key, value["seq"], why))
        if len(sources[source]) > 1:
            continue  # said again by a worker that did not commit past it (at least once, as any output)
        dead_n[key] += 1
        dead_sum[key] += value["amount"]
        reasons[why] += 1
    again = {s: d for s, d in sources.items() if len(d) > 1}
    print(f"{len(hostile)} records with reserved headers; dead letters by reason: {dict(reasons)}; again: {again}")
    got = {k: (state.get(k, {}).get("n", 0) + dead_n[k], state.get(k, {}).get("sum", 0) + dead_sum[k]) for k in written}
    expected = {k: (written[k], amounts[k]) for k in written}
    wrong = {k: {"written": expected[k], "applied + dead": got[k]} for k in written if got[k] != expected[k]}
    suspects = [r for k in wrong for r in of_key(k)]
    theirs = {s: d for s, d in sources.items() if d[0][0] in wrong}
    assert not wrong and set(state) <= set(written), (
        f"records lost or applied twice: {wrong}\n"
        f"hostile records of those keys (key, value, headers, partition): {suspects}\n"
        f"dead letters of those keys by (partition, offset): {theirs}"
    )
