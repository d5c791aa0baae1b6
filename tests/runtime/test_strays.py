"""Records from a plain Kafka producer (default partitioner) in a topic with a layout:
into reserved partitions, into partitions before their activation, into active
partitions after an expansion. Every record is applied exactly once, on the processor
owning its key, or dead-lettered with reason ``misplaced``; ``topics check`` and
``status`` report the strays. Real worker processes, the real broker, real stores."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from streamkit.kafkaio import KafkaIO
from streamkit.layout import transitions
from streamkit.layout.protocol import LayoutCoordinator
from streamkit.layout.registry import LayoutRegistry
from streamkit.layout.strays import activation
from streamkit.runtime.progress import ProgressLog
from streamkit.testing import default_partition, produce_json, read_topic
from tests.runtime.jobs import ROOT, Job, make_records, read_state, reference, wait_for_log

P0 = 2
ACTIVE, CAPACITY = 4, 8


def layout_topic(broker: str, partitions: int, capacity: int) -> str:
    topic = f"strays-{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        async with LayoutCoordinator(broker) as co:
            await co.create(topic, partitions, capacity=capacity)

    asyncio.run(go())
    return topic


def expand(broker: str, topic: str, partitions: int) -> None:
    async def go() -> None:
        async with LayoutCoordinator(broker, ack_timeout=10.0) as co:
            await co.expand(topic, partitions)

    asyncio.run(go())


def expand_after_the_sweep_passed(job: Job, partitions: int, swept: int) -> None:
    """``expand``, with the coordinator stalling between reading the announce offsets and
    announcing until the group's sweep of partition ``swept`` committed beyond them: a
    legal interleaving (records land there meanwhile) in which the sweep reads past the
    activation before any worker can know of it, whenever its registry poll comes."""

    async def go() -> None:
        async with LayoutCoordinator(job.bootstrap, ack_timeout=10.0) as co:
            layout = await co.registry.load(job.topic)
            hws = await co.io.high_watermarks(job.topic, range(layout.physical))
            deadline = time.monotonic() + 60
            while (await co.io.committed(f"streamkit-{job.app}", job.topic, [swept])).get(swept, 0) <= hws[swept]:
                assert time.monotonic() < deadline, f"the sweep of {swept} did not pass {hws[swept]}"
                await asyncio.sleep(0.1)
            await co.registry.publish(transitions.expand(layout, partitions, announce_offsets=hws))
            await co.resume(job.topic)  # waits for the acknowledgements, seals

    asyncio.run(go())


def wait_drained(job: Job, timeout: float = 120.0, capacity: int = CAPACITY) -> dict[int, int]:
    """Until the group committed every partition (reserved ones too) up to its high
    watermark twice in a row: forwarded copies land after their originals are read."""
    group = f"streamkit-{job.app}"

    async def look() -> tuple[dict[int, int], dict[int, int]]:
        async with KafkaIO(job.bootstrap) as io:
            hws = await io.high_watermarks(job.topic, range(capacity))
            return hws, await io.committed(group, job.topic, range(capacity))

    deadline = time.monotonic() + timeout
    settled = 0
    while settled < 2:
        hws, com = asyncio.run(look())
        settled = settled + 1 if all(com.get(p, 0) >= hw for p, hw in hws.items()) else 0
        for w in job.workers:
            assert w.poll() is None, f"worker exited with {w.returncode}: {job.log(w, 3000)}"
        assert time.monotonic() < deadline, f"not drained after {timeout} s: committed {com}, high watermarks {hws}"
        time.sleep(0.5)
    return hws


def misplaced(records: list, active: int) -> int:
    """How many of ``records`` Kafka's partitioner puts where ``active`` partitions of
    linear hashing over ``ACTIVE`` do not."""
    return sum(
        default_partition(k.encode(), CAPACITY) != lh_bucket(key_hash(k.encode()), ACTIVE, active) for k, _ in records
    )


def cli(job: Job, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamkit.cli", *args], cwd=ROOT, env=job.env(), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_a_plain_producer_loses_nothing_around_reserved_capacity_and_an_expansion(broker: str, tmp_path: Path) -> None:
    topic = layout_topic(broker, ACTIVE, CAPACITY)
    job = Job(broker, f"strays-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", P0)
    before, after = make_records(3000, 300), make_records(3000, 300, start=3000)
    assert {default_partition(k.encode(), CAPACITY) for k, _ in before} == set(range(CAPACITY))
    try:
        produce_json(broker, topic, before)  # Kafka's partitioner: over all 8 physical partitions
        for _ in range(2):
            job.start_worker()
        wait_drained(job)
        expand(broker, topic, 6)  # 4 and 5 become active, holding records written before
        produce_json(broker, topic, after)
        wait_drained(job)
        checked = cli(job, "topics", "check", topic)
        described = cli(job, "topics", "describe", topic, "--group", f"streamkit-{job.app}")
    finally:
        job.stop_all()
    assert all(w.returncode == 0 for w in job.workers), [job.log(w, 2000) for w in job.workers]
    for partition, parent in ((4, 0), (5, 1)):  # their gates opened long ago: passed, nothing pending
        assert re.search(rf"│ +{partition} │ ReadWrite .*│ +│ after p{parent}@\d+ \(e2\) +│\n", described.stdout), (
            described.stdout
        )
    status = cli(job, "status", "tests.runtime.job_app:app")  # the workers' last words
    state, _ = read_state(job, P0)  # fails if a key is in two processors' stores
    expected = reference(before + after)
    assert counts(state) == counts(expected)
    copies = [r for r in read_topic(broker, topic) if any(h[0] == "streamkit.stray.from" for h in r.headers)]
    strays = misplaced(before, ACTIVE) + misplaced(after, 6)
    # a forwarder that lost its partitions in a rebalance before its checkpoint wrote some
    # twice: the receiving processors applied each once (the state above is exact)
    origins = {dict(r.headers)["streamkit.stray.from"] for r in copies}
    # A plain producer's record written into 4 or 5 after the expansion's announcement but
    # before the worker sweeping that partition learnt of it is forwarded too (it carries
    # no epoch to tell): applied once, through its copy (the state above is exact).
    raced = sum(default_partition(k.encode(), CAPACITY) in (4, 5) for k, _ in after)  # in place there
    assert strays <= len(origins) <= strays + raced
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"strays {strays}, all forwarded" in checked.stdout, checked.stdout
    by_origin = Counter(dict(r.headers)["streamkit.stray.from"].split(b":")[0].decode() for r in copies)
    for partition, n in by_origin.items():
        assert re.search(rf"│ {topic} +│ +{partition} │.*│ {n} forwarded", status.stdout), status.stdout


def test_strays_go_to_the_dead_letters_when_the_topic_says_so(broker: str, tmp_path: Path) -> None:
    topic = layout_topic(broker, ACTIVE, CAPACITY)
    job = Job(broker, f"strays-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", P0)
    records = make_records(2000, 200)
    try:
        produce_json(broker, topic, records)
        job.start_worker(SK_TEST_STRAYS="dead-letter")
        wait_drained(job)
        checked = cli(job, "topics", "check", topic)
        status = cli(job, "status", "tests.runtime.job_app:app")
    finally:
        job.stop_all()
    dead = read_topic(broker, f"{job.app}-dead-letters")
    misplaced = [r for r in dead if dict(r.headers).get("streamkit.error.reason") == b"misplaced"]
    state, _ = read_state(job, P0)
    assert misplaced and sum(v["n"] for v in state.values()) + len(misplaced) == len(records)
    assert checked.returncode != 0 and f"{len(misplaced)} not forwarded" in checked.stdout, checked.stdout
    assert "misplaced" in status.stdout, status.stdout


def sweep_of(broker: str, job: Job, partition: int) -> tuple[int | None, dict[int, int]]:
    """The partition's activation offset, and where the group recorded its sweep ended."""

    async def go() -> tuple[int | None, dict[int, int]]:
        async with LayoutRegistry(broker) as reg, KafkaIO(broker) as io:
            layout = await reg.load(job.topic)
            progress = ProgressLog(io, None, f"streamkit-{job.app}")  # type: ignore[arg-type]  # read only
            await progress.refresh()
            return activation(layout, partition), progress.sweep_ends(job.topic, partition)

    return asyncio.run(go())


def test_what_a_sweep_forwarded_past_an_activation_a_rebuild_does_not_apply_again(broker: str, tmp_path: Path) -> None:
    """A plain producer writes into reserved partition 2 while the topic expands 2 -> 3.
    The worker sweeping partition 2 forwards what it reads until it learns of the
    expansion, past the announce offset; the group records where the sweep ended. A
    processor rebuilt from history later (its store lost) applies those records once,
    through their copies, as the running one did."""
    topic = layout_topic(broker, 2, 4)
    job = Job(broker, f"swept-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", 1)
    before, during = make_records(1000, 200), make_records(8000, 200, start=1000)
    assert sum(default_partition(k.encode(), 4) == 2 for k, _ in during) > 1000

    def write_during() -> None:  # about 4 s of records, the expansion in the middle
        for i in range(0, len(during), 200):
            produce_json(broker, topic, during[i : i + 200])
            time.sleep(0.1)

    try:
        produce_json(broker, topic, before)
        job.start_worker(STREAMKIT_LAYOUT_POLL_INTERVAL="2")  # a wide window: the sweep learns of it late
        wait_drained(job, capacity=4)
        writer = threading.Thread(target=write_during)
        writer.start()
        time.sleep(1.5)
        expand_after_the_sweep_passed(job, 3, 2)
        writer.join()
        wait_drained(job, capacity=4)
        activated, ends = sweep_of(broker, job, 2)
        job.stop_all()
        assert all(w.returncode == 0 for w in job.workers), [job.log(w, 2000) for w in job.workers]
        assert_applied_once(job, before + during)
        # the race this is about happened: the sweep forwarded records beyond the activation
        assert activated is not None and ends.get(activated, 0) > activated, (activated, ends)
        after = make_records(4, 200, start=9000)
        rebuild_on_a_new_machine(job, tmp_path / "state", after)
    finally:
        job.stop_all()
    assert all(w.returncode == 0 for w in job.workers), [job.log(w, 2000) for w in job.workers]
    assert_applied_once(job, before + during + after)


def test_a_sweep_killed_before_its_checkpoint_leaves_one_copy_of_each_stray_across_an_expansion(
    broker: str, tmp_path: Path
) -> None:
    """A worker sweeping reserved partitions 2 and 3 forwards their strays and is SIGKILLed
    before any checkpoint; the topic then expands 2 -> 3, which activates partition 2 and
    moves keys. The next worker starts both partitions where the group was, below what the
    dead sweep forwarded: under the new layout it would send some strays elsewhere than
    their first copies, and both would be applied. It finds the copies that exist and
    forwards only the rest: every record applied once, also by a processor rebuilt from
    history."""
    topic = layout_topic(broker, 2, 4)
    job = Job(broker, f"sweepkill-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", 1)
    before = make_records(3000, 300)
    stray_offsets = {q: sum(default_partition(k.encode(), 4) == q for k, _ in before) for q in (2, 3)}
    never = {"SK_TEST_COMMIT_INTERVAL": "3600", "STREAMKIT_COMMIT_EVERY": "1000000000",
             "STREAMKIT_CHECKPOINT_DIRTY_KEYS": "1000000000"}  # fmt: skip
    try:
        # written once the worker hosts its processors: however fast it sweeps, no checkpoint
        # follows its assignment, so the sweep's forwards outrun the progress log
        worker = job.start_worker(**never)
        wait_for_log(job, worker, "hosts processors")
        produce_json(broker, topic, before)
        deadline = time.monotonic() + 60
        while True:  # until the sweep forwarded every stray of partitions 2 and 3
            origins = Counter(o.split(b":")[0] for o in copies_from(broker, topic))
            if all(origins[str(q).encode()] >= n for q, n in stray_offsets.items()):
                break
            assert job.workers[0].poll() is None, job.log(job.workers[0], 3000)
            assert time.monotonic() < deadline, (origins, stray_offsets)
            time.sleep(0.2)
        job.kill_all()
        positions = swept_positions(broker, job, (2, 3))
        assert all(positions[q] < n for q, n in stray_offsets.items()), positions  # the forwards outran the log
        expand(broker, topic, 3)
        job.workers.clear()
        job.start_worker()
        after = make_records(600, 300, start=3000)
        produce_json(broker, topic, after)
        wait_drained(job, capacity=4)
        job.stop_all()
        assert all(w.returncode == 0 for w in job.workers), [job.log(w, 2000) for w in job.workers]
        assert_applied_once(job, before + after)
        dests: dict[bytes, set[int]] = {}
        for d, o in copy_dests(broker, topic):
            dests.setdefault(o, set()).add(d)
        assert all(len(d) == 1 for d in dests.values()), {o: d for o, d in dests.items() if len(d) > 1}
        last = make_records(4, 300, start=3600)
        rebuild_on_a_new_machine(job, tmp_path / "state", last)
    finally:
        job.stop_all()
    assert all(w.returncode == 0 for w in job.workers), [job.log(w, 2000) for w in job.workers]
    assert_applied_once(job, before + after + last)


def counts(state: dict[str, dict]) -> dict[str, tuple[int, int]]:
    return {k: (v["n"], v["sum"]) for k, v in state.items()}


def assert_applied_once(job: Job, records: list) -> None:
    """The one processor's state is every record applied once."""
    state, _ = read_state(job, 1)
    assert counts(state) == counts(reference(records))


def rebuild_on_a_new_machine(job: Job, state_dir: Path, records: list) -> None:
    """Lose the stores, start a worker (its processor is rebuilt from history) and wait
    until ``records``, written now, are committed: only once the rebuild is done."""
    shutil.rmtree(state_dir)
    job.workers.clear()
    job.start_worker()
    produce_json(job.bootstrap, job.topic, records)
    wait_drained(job, capacity=4)


def copy_dests(broker: str, topic: str) -> list[tuple[int, bytes]]:
    """(partition, origin) of every forwarded copy in the topic."""
    return [(r.partition, h[1]) for r in read_topic(broker, topic) for h in r.headers if h[0] == "streamkit.stray.from"]


def copies_from(broker: str, topic: str) -> list[bytes]:
    return [o for _, o in copy_dests(broker, topic)]


def swept_positions(broker: str, job: Job, partitions: tuple[int, ...]) -> dict[int, int]:
    async def go() -> dict[int, int]:
        async with KafkaIO(broker) as io:
            progress = ProgressLog(io, None, f"streamkit-{job.app}")  # type: ignore[arg-type]  # read only
            await progress.refresh()
            return {q: progress.position(job.topic, q) for q in partitions}

    return asyncio.run(go())
