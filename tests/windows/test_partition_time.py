"""Time across partitions: a processor that reads several partitions applies their
records in timestamp order (heads only: each partition in its offset order), as it does
its topics' records, so what is late and what a window holds do not depend on which
partition a fetch brought first. Two processors read two partitions each of a history
of out-of-order and late records, written before the worker starts (every fetch then
brings one partition far ahead of the others): the stores hold exactly the windows of
the reference applied in that order, every close is sent with its final value, the late
records are the reference's; and a rebuild from the input and a restore from the
changelog give the same windows and send no close again. One processor reading all four
partitions too."""

from __future__ import annotations

import asyncio
import heapq
import random
import shutil
import signal
import threading
import time
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from assignors.linear_hashing import lh_bucket, partition_for_key
from assignors.murmur2 import key_hash
from assignors.placement import partitions_for_processor
from streamkit.testing import create_topic, read_topic, unique_topic_name
from tests.runtime.jobs import committed
from tests.windows import reference
from tests.windows.test_windows_driver import expected, history
from tests.windows.test_windows_worker import Worker, _read_if_any, produce, sent_closes, stores
from tests.windows.windows_app import KINDS

PARTITIONS, PROCESSORS = 4, 2
BASE_MS = 1_700_000_000_000

Applied = list[tuple[str, int, int]]


def merged_order(records: Applied, pid: int, processors: int = PROCESSORS) -> Applied:
    """Processor ``pid``'s records in the order it applies them: its partitions merged by
    (timestamp, partition, offset) of their next records (of a partition it shares with
    other processors, its keys' records only)."""
    parts: dict[int, list[tuple[int, int, int, str, int]]] = {}
    for key, ts, n in records:
        if lh_bucket(key_hash(key.encode()), processors, processors) != pid:
            continue
        q = partition_for_key(key.encode(), PARTITIONS, PARTITIONS)
        at = parts.setdefault(q, [])
        at.append((ts, q, len(at), key, n))
    mine = [parts.get(q, []) for q in partitions_for_processor(pid, PARTITIONS, PARTITIONS, processors, processors)]
    return [(key, ts, n) for ts, _, _, key, n in heapq.merge(*mine)]


def merged_reference(records: Applied, processors: int = PROCESSORS) -> dict[str, reference.Result]:
    """Per kind, the windows (as stored), closes and late records of every processor
    applying its records in merged order."""
    want = {kind: reference.Result() for kind in KINDS}
    for pid in range(processors):
        applied = merged_order(records, pid, processors)
        for kind in KINDS:
            one = expected(kind, applied)
            want[kind].windows.update(one.stored or one.windows)  # as stored (sliding: per record time)
            want[kind].closes.update(one.closes)
            want[kind].late += one.late
    return want


@pytest.mark.parametrize("processors", [PROCESSORS, 1, 3])
def test_a_processor_reading_several_partitions_judges_time_as_the_merged_reference(
    broker: str, tmp_path: Path, processors: int
) -> None:
    """Two or four partitions per processor (with three processors each reads all four,
    sharing them with the other two): the live run, a rebuild from the input and a restore
    from the changelog hold the windows of the merged reference."""
    records = history(53, n=1600, keys=16)
    topic, app = unique_topic_name("ptime"), unique_topic_name("ptimeapp")
    create_topic(broker, topic, partitions=PARTITIONS)
    asyncio.run(produce(broker, topic, records, PARTITIONS))
    want = merged_reference(records, processors)
    assert all(want[k].late for k in ("tumbling", "session")), "the history has late records"

    worker = Worker(broker, tmp_path, app, topic)
    worker.env["STREAMKIT_PROCESSORS"] = str(processors)
    worker.start()
    worker.wait_for("hosts processors")
    worker.wait_committed(broker, topic, PARTITIONS, len(records))
    assert worker.stop() == 0, worker.log()[-3000:]

    held = stores(tmp_path, app, processors)
    for kind in KINDS:
        assert held[kind] == want[kind].windows, f"{kind}: windows differ from the merged reference"
    sent = sent_closes(broker, app)
    for kind in KINDS:
        mine = {(k, s): totals for (kd, k, s), totals in sent.items() if kd == kind}
        assert mine == {w: [total] for w, total in want[kind].closes.items()}, f"{kind}: closes differ"
    late: dict[str, int] = {}
    for rec in read_topic(broker, f"{app}-closes-late"):
        table = orjson.loads(rec.value)["table"]
        late[table] = late.get(table, 0) + 1
    assert late == {f"sums_{k}": want[k].late for k in KINDS if want[k].late}

    # every store lost, twice: rebuilt from the input (no changelog), then restored from
    # the changelog the live run wrote: the same windows, no close sent again
    for how, changelog in (("rebuilt from", "false"), ("restored from the changelog", "true")):
        for pid in range(processors):
            shutil.rmtree(tmp_path / "state" / app / f"processor-{pid}")
        worker.env["STREAMKIT_CHANGELOG"] = changelog
        worker.start()
        worker.wait_for("hosts processors")
        assert how in worker.log(), worker.log()[-3000:]
        assert worker.stop() == 0, worker.log()[-3000:]
        held = stores(tmp_path, app, processors)
        for kind in KINDS:
            assert held[kind] == want[kind].windows, f"{kind}: windows differ once {how}"
        assert len(read_topic(broker, f"{app}-closes")) == sum(len(t) for t in sent.values()), "closes sent again"
        assert len(read_topic(broker, f"{app}-closes-late")) == sum(late.values()), "late records reported again"


def live_history(seed: int, n: int, keys: int) -> list[tuple[str, int, int]]:
    """``n`` records written live: event time moves 25 ms a record, each record up to
    1.5 s behind it (less than every kind's grace): none is late, in any order a
    processor may apply them in that keeps each partition's."""
    rng = random.Random(seed)
    return [(f"k{rng.randrange(keys)}", BASE_MS + i * 25 - rng.randrange(1500), rng.randrange(1, 10)) for i in range(n)]


async def produce_live(broker: str, topic: str, records: list[tuple[str, int, int]], per_second: int) -> None:
    """``records`` at ``per_second``, in order, each to its key's partition."""
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all", linger_ms=5)
    await producer.start()
    try:
        chunk = per_second // 10
        for i in range(0, len(records), chunk):
            sent = [
                await producer.send(
                    topic,
                    orjson.dumps({"n": n}),
                    key=key.encode(),
                    timestamp_ms=ts,
                    partition=partition_for_key(key.encode(), PARTITIONS, PARTITIONS),
                )  # fmt: skip
                for key, ts, n in records[i : i + chunk]
            ]
            await asyncio.gather(*sent)
            await asyncio.sleep(0.1)
    finally:
        await producer.stop()


def test_records_written_live_within_the_grace_are_never_late_through_a_kill(broker: str, tmp_path: Path) -> None:
    """The run the time issue reported, without its scaling: two processors on four
    partitions, records written live with less disorder than any grace, the worker
    SIGKILLed midway (the restarted processors read two partitions each from their
    checkpoints, one far ahead of the other): no record is late, every window holds the
    reference's value, and every close sent carries the window's final value."""
    records = live_history(54, n=2000, keys=30)
    topic, app = unique_topic_name("plive"), unique_topic_name("pliveapp")
    create_topic(broker, topic, partitions=PARTITIONS)
    want = merged_reference(records)
    for kind in KINDS:
        assert want[kind].late == 0, f"{kind}: the reference has late records"

    worker = Worker(broker, tmp_path, app, topic)
    worker.env["STREAMKIT_PROCESSORS"] = str(PROCESSORS)
    # a partition's newest records may reach the broker a little after another's: the
    # merge waits that long for a partition that has none (with 0 that delivery skew
    # counts as disorder, and a record can be late against another partition's time)
    worker.env["STREAMKIT_MAX_TASK_IDLE_MS"] = "1000"
    writer = threading.Thread(target=lambda: asyncio.run(produce_live(broker, topic, records, 500)), daemon=True)
    worker.start()
    worker.wait_for("hosts processors")
    writer.start()
    deadline = time.monotonic() + 60
    while sum(committed(broker, f"streamkit-{app}", topic, PARTITIONS).values()) < len(records) // 3:
        assert time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.2)
    assert worker.stop(signal.SIGKILL) == -signal.SIGKILL
    time.sleep(1.0)  # the others run ahead meanwhile
    worker.start()
    worker.wait_for("hosts processors")
    writer.join(60)
    worker.wait_committed(broker, topic, PARTITIONS, len(records))
    assert worker.stop() == 0, worker.log()[-3000:]

    late = _read_if_any(broker, f"{app}-closes-late")
    assert not late, f"{len(late)} records judged late, e.g. {[orjson.loads(r.value) for r in late[:3]]}"
    held = stores(tmp_path, app)
    for kind in KINDS:
        assert held[kind] == want[kind].windows, f"{kind}: windows differ from the reference"
    sent = sent_closes(broker, app)
    for kind in KINDS:
        mine = {(k, s): set(totals) for (kd, k, s), totals in sent.items() if kd == kind}
        assert mine == {w: {total} for w, total in want[kind].closes.items()}, f"{kind}: closes differ"
