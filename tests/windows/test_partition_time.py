"""Time across partitions: a processor that reads several partitions applies their
records in timestamp order (heads only: each partition in its offset order), as it does
its topics' records, so what is late and what a window holds do not depend on which
partition a fetch brought first. Two processors read two partitions each of a history
of out-of-order and late records, written before the worker starts (every fetch then
brings one partition far ahead of the others): the stores hold exactly the windows of
the reference applied in that order, every close is sent with its final value, the late
records are the reference's; and a rebuild from the input gives the same windows and
sends no close again."""

from __future__ import annotations

import asyncio
import heapq
import shutil
import time
from pathlib import Path

import orjson

from assignors.linear_hashing import partition_for_key
from assignors.placement import partitions_for_processor
from streamkit.testing import create_topic, read_topic, unique_topic_name
from tests.runtime.jobs import committed
from tests.windows import reference
from tests.windows.test_windows_driver import expected, history
from tests.windows.test_windows_worker import Worker, produce, stores
from tests.windows.windows_app import KINDS

PARTITIONS, PROCESSORS = 4, 2

Applied = list[tuple[str, int, int]]


def merged_order(records: Applied, pid: int) -> Applied:
    """Processor ``pid``'s records in the order it applies them: its partitions merged by
    (timestamp, partition, offset) of their next records."""
    parts: dict[int, list[tuple[int, int, int, str, int]]] = {}
    for key, ts, n in records:
        q = partition_for_key(key.encode(), PARTITIONS, PARTITIONS)
        at = parts.setdefault(q, [])
        at.append((ts, q, len(at), key, n))
    mine = [parts.get(q, []) for q in partitions_for_processor(pid, PARTITIONS, PARTITIONS, PROCESSORS, PROCESSORS)]
    return [(key, ts, n) for ts, _, _, key, n in heapq.merge(*mine)]


def test_a_processor_reading_several_partitions_judges_time_as_the_merged_reference(
    broker: str, tmp_path: Path
) -> None:
    records = history(53, n=1600, keys=16)
    topic, app = unique_topic_name("ptime"), unique_topic_name("ptimeapp")
    create_topic(broker, topic, partitions=PARTITIONS)
    asyncio.run(produce(broker, topic, records, PARTITIONS))
    want = {kind: reference.Result() for kind in KINDS}
    for pid in range(PROCESSORS):
        applied = merged_order(records, pid)
        for kind in KINDS:
            one = expected(kind, applied)
            want[kind].windows.update(one.stored or one.windows)  # as stored (sliding: per record time)
            want[kind].closes.update(one.closes)
            want[kind].late += one.late
    assert all(want[k].late for k in ("tumbling", "session")), "the history has late records"

    worker = Worker(broker, tmp_path, app, topic)
    worker.env["STREAMKIT_PROCESSORS"] = str(PROCESSORS)
    worker.start()
    worker.wait_for("hosts processors")
    deadline = time.monotonic() + 120
    while sum((at := committed(broker, f"streamkit-{app}", topic, PARTITIONS)).values()) < len(records):
        assert worker.proc is not None and worker.proc.poll() is None, worker.log()[-3000:]
        assert time.monotonic() < deadline, f"stuck at {at} of {len(records)}: {worker.stacks()}"
        time.sleep(0.3)
    assert worker.stop() == 0, worker.log()[-3000:]

    held = stores(tmp_path, app)
    for kind in KINDS:
        assert held[kind] == want[kind].windows, f"{kind}: windows differ from the merged reference"
    sent: dict[tuple[str, str, int], list[int]] = {}
    for rec in read_topic(broker, f"{app}-closes"):
        v = orjson.loads(rec.value)
        sent.setdefault((v["kind"], rec.key.decode(), v["start"]), []).append(v["total"])
    for kind in KINDS:
        mine = {(k, s): totals for (kd, k, s), totals in sent.items() if kd == kind}
        assert mine == {w: [total] for w, total in want[kind].closes.items()}, f"{kind}: closes differ"
    late: dict[str, int] = {}
    for rec in read_topic(broker, f"{app}-closes-late"):
        table = orjson.loads(rec.value)["table"]
        late[table] = late.get(table, 0) + 1
    assert late == {f"sums_{k}": want[k].late for k in KINDS if want[k].late}

    # both stores lost and rebuilt from the input: the same windows, no close sent again
    for pid in range(PROCESSORS):
        shutil.rmtree(tmp_path / "state" / app / f"processor-{pid}")
    worker.env["STREAMKIT_CHANGELOG"] = "false"
    worker.start()
    worker.wait_for("hosts processors")
    assert "rebuilt from" in worker.log(), worker.log()[-3000:]
    assert worker.stop() == 0, worker.log()[-3000:]
    held = stores(tmp_path, app)
    for kind in KINDS:
        assert held[kind] == want[kind].windows, f"{kind}: windows differ after a rebuild from the input"
    assert len(read_topic(broker, f"{app}-closes")) == sum(len(t) for t in sent.values()), "closes sent again"
