"""The pure parts of processor scaling: the steps of a scale change, which stores a
count change touches, and the staging store's adoption (real RocksDB, no broker)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import streamkit
from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from stores.base import Checkpoint
from stores.rocksdb import RocksDBStore
from streamkit.checkpoint_keys import RETIRED, SIDES
from streamkit.cli.scale import plan_moves
from streamkit.exactly_once.markers import marker_of
from streamkit.exactly_once.writer import Writers
from streamkit.runtime.jobmeta import Bootstrap, JobLayout
from streamkit.runtime.key_sets import StoreOpening, adopt_store, key_set_change, open_for_count, staging_path
from streamkit.state.changelog import MARKER_PREFIX, Marker


def test_each_step_of_a_scale_change_bootstraps_one_processor() -> None:
    grow = JobLayout("a", 2, 3, epoch=5, target=5)
    assert grow.bootstrap == Bootstrap(pid=3, count=4, beside=1, staging=False)
    assert grow.hosted == 4 and grow.retiring is None
    nxt = grow.stepped(by="x")
    assert (nxt.p, nxt.epoch, nxt.target) == (4, 6, 5)
    assert nxt.stepped(by="x").target is None  # the last step ends the change
    shrink = JobLayout("a", 2, 4, epoch=7, target=2)
    # processor 3 retires: its keys go back to processor 1, rebuilt for 3 into a staging store
    assert shrink.retiring == 3 and shrink.bootstrap == Bootstrap(pid=1, count=3, beside=1, staging=True)
    assert shrink.hosted == 4 and shrink.joining is None
    assert shrink.stepped(by="x").bootstrap == Bootstrap(pid=0, count=2, beside=0, staging=True)
    assert JobLayout("a", 2, 2).bootstrap is None


@pytest.mark.parametrize(("stored", "count", "change"), [(2, 3, "shrank"), (3, 2, "grew"), (3, 4, None), (4, 3, None)])
def test_a_count_change_touches_only_the_stores_whose_keys_change(stored: int, count: int, change: str | None) -> None:
    # processor 0 splits at 2 -> 3 and receives back at 3 -> 2; 3 -> 4 splits processor 1 only
    assert key_set_change(0, 2, stored, count) == change
    assert key_set_change(0, 2, None, count) is None


def test_the_plan_of_a_shrink_names_the_retiring_processors_in_order() -> None:
    moves = plan_moves(2, 4, 2, {"t": (2, 4)})
    assert [m.describe() for m in moves] == [
        "processor 3: retires, its keys go back to processor 1 in partitions t [3] (about 25.0% of all keys)",
        "processor 2: retires, its keys go back to processor 0 in partitions t [2] (about 25.0% of all keys)",
    ]
    assert [m.moved for m in plan_moves(2, 2, 4, {"t": (2, 4)})] == [2, 3]


def _write(path: Path, keys: list[bytes], p: int) -> None:
    with RocksDBStore.open(str(path), ["seen"]) as store:
        store.commit({"seen": dict.fromkeys(keys, b"1")}, Checkpoint(positions={("t", 0): 10}, extra={"p": p}))


def _keys(path: Path) -> set[bytes]:
    with RocksDBStore.open(str(path), ["seen"]) as store:
        return {k for k, _ in store.items("seen")}


def test_a_receiving_store_is_replaced_by_its_staging_store_or_emptied(tmp_path: Path) -> None:
    live = tmp_path / "processor-0"
    _write(live, [b"a"], p=3)
    assert adopt_store(live, 2) == "emptied, to be rebuilt" and not live.exists()
    _write(live, [b"a"], p=3)
    _write(staging_path(live), [b"a", b"b"], p=3)  # built for another count: not used
    assert adopt_store(live, 2) == "emptied, to be rebuilt"
    _write(live, [b"a"], p=3)
    _write(staging_path(live), [b"a", b"b"], p=2)
    assert adopt_store(live, 2) == "replaced by its staging store"
    assert _keys(live) == {b"a", b"b"} and not staging_path(live).exists()


def test_opening_for_more_processors_purges_the_keys_that_moved(tmp_path: Path) -> None:
    keys = [f"k{i}".encode() for i in range(100)]
    path = tmp_path / "processor-0"
    _write(path, [k for k in keys if lh_bucket(key_hash(k), 2, 2) == 0], p=2)
    app = streamkit.App("steps")
    app.table("seen")
    tables = app.tables

    async def reopen(count: int) -> set[bytes]:
        proc = await open_for_count(0, path, StoreOpening(tables, 1.0), 2, count, log_as="test", adopt=True)
        proc.close()
        return _keys(path)

    kept = asyncio.run(reopen(3))
    assert kept and kept == {k for k in keys if lh_bucket(key_hash(k), 2, 3) == 0}
    assert asyncio.run(reopen(3)) == kept  # the same count again: nothing changes
    assert asyncio.run(reopen(2)) == set()  # keys came back, no staging store: rebuilt from the history


@pytest.mark.parametrize("count", [3, 2])
def test_a_receiving_store_emptied_to_be_rebuilt_keeps_each_key_set_on_its_own_stream_time(
    tmp_path: Path, count: int
) -> None:
    """No staging store (its bootstrap's host died): the receiving processor's store is
    rebuilt from the history, where the retired processor's partitions stop where it
    stopped, possibly seconds before the receiving processor's own. On one stream time,
    their next records would be judged by the other partitions' time (late), and the
    retired keys' windows closed silently, their closes lost: so each key set keeps its
    own, as in a staging store (``sides``), checkpointed from the start.

    ``count`` 2: a store written for 4 processors opened when the job has 2 (it missed the
    4 -> 3 step that gave processor 1 processor 3's keys, then the job went on to 2, whose
    step moved processor 2's keys into 0, not into 1): told apart by the placement the
    store was written for, not by the last step's (at 3 processors, processor 1's keys
    are one key set)."""
    from streamkit.windows import Tumbling

    app = streamkit.App("steps-sides")
    app.table("seen")
    app.table("per_s", default=int, window=Tumbling(1))
    path = tmp_path / "processor-1"
    with RocksDBStore.open(str(path), sorted(app.tables)) as store:
        store.commit({}, Checkpoint(positions={("t", 1): 10}, extra={"p": 4}))

    async def reopen() -> Any:
        return await open_for_count(1, path, StoreOpening(app.tables, 1.0), 2, count, log_as="test", adopt=True)

    proc = asyncio.run(reopen())
    try:
        assert proc.loaded.extra[RETIRED] == [3] and proc.sides is not None
        assert (proc.sides.p0, proc.sides.p) == (2, 4)  # told apart by the placement before the shrink
        mine = [k for k in (f"k{i}".encode() for i in range(50)) if lh_bucket(key_hash(k), 2, count) == 1]
        assert {proc.sides.side_of(k) for k in mine} == {1, 3}
    finally:
        proc.close()
    proc = asyncio.run(reopen())  # a crash during the rebuild: still two
    try:
        assert proc.sides is not None
    finally:
        proc.close()


def test_a_store_emptied_to_be_rebuilt_keeps_apart_the_key_sets_its_own_times_kept_apart(tmp_path: Path) -> None:
    """Processor 0's store, a staging store of the 5 -> 4 shrink (processor 4's keys came
    back to it) still on two times when its host died, is opened with the job at 2: its
    key sets are told apart by the placement its own times were kept by (5), finer than
    the count it was written for (4), so that 0's and 4's keys do not become one time."""
    from streamkit.windows import Tumbling

    app = streamkit.App("steps-sides-kept")
    app.table("per_s", default=int, window=Tumbling(1))
    path = tmp_path / "processor-0"
    sides = {"p0": 2, "p": 5, "times": {"0": 2_000, "4": 1_000}}
    with RocksDBStore.open(str(path), sorted(app.tables)) as store:
        store.commit({}, Checkpoint(positions={("t", 0): 10}, extra={"p": 4, SIDES: sides, RETIRED: [4]}))
    proc = asyncio.run(open_for_count(0, path, StoreOpening(app.tables, 1.0), 2, 2, log_as="test", adopt=True))
    try:
        assert proc.sides is not None and (proc.sides.p0, proc.sides.p) == (2, 5)
        mine = [k for k in (f"k{i}".encode() for i in range(80)) if lh_bucket(key_hash(k), 2, 2) == 0]
        assert {proc.sides.side_of(k) for k in mine} == {0, 2, 4}
    finally:
        proc.close()


def test_a_receiving_store_names_the_processors_retired_into_it_until_its_writer_announced_them(
    tmp_path: Path,
) -> None:
    """A shrink 4 -> 2 (p0 = 2) retires processors 2 and 3 into 0 and 1: the store processor
    0 takes (its staging store, or an empty one) names 2 (``RETIRED``); its exactly-once
    writer, opened from it, announces writer 2 as ended (a recovery marker of writer 2
    with nothing committed, under its own incarnation) at its first checkpoint, and the
    checkpoints after it no longer name it."""
    app = streamkit.App("steps")
    app.table("seen")

    async def reopen(path: Path) -> dict[str, Any]:
        proc = await open_for_count(0, path, StoreOpening(app.tables, 1.0), 2, 2, log_as="test", adopt=True)
        try:
            return dict(proc.loaded.extra)
        finally:
            proc.close()

    staged, emptied = tmp_path / "a" / "processor-0", tmp_path / "b" / "processor-0"
    for path in (staged, emptied):
        path.parent.mkdir()
        _write(path, [b"a"], p=4)
    _write(staging_path(staged), [b"a", b"b"], p=2)
    extra = asyncio.run(reopen(staged))
    assert extra[RETIRED] == [2] and _keys(staged) == {b"a", b"b"}
    assert asyncio.run(reopen(staged))[RETIRED] == [2]  # (the same count again: it keeps the list)
    assert asyncio.run(reopen(emptied))[RETIRED] == [2] and _keys(emptied) == set()

    writer = Writers("steps").open(0, 7, extra, active=2)
    marks: list[Any] = []

    async def mark(topic: str, header: tuple[str, bytes]) -> None:
        marks.append(marker_of(SimpleNamespace(key=None, value=b"", headers=[header])))

    assert writer.retired_owed() == [2]
    asyncio.run(writer.committed(mark, ["out"]))
    assert [(m.writer, m.incarnation, m.recovered) for m in marks] == [
        ("steps/0", writer.incarnation, {}),
        ("steps/2", writer.incarnation, {}),
    ]
    assert writer.retired_owed() == []
    assert Writers("steps").open(0, 8, extra, active=3).retired == []  # grown back: processor 2 is itself again


class _TruncatedTopic:
    """The reads the history check makes, of a topic whose retention removed the first
    500 records of partition 2 (the test broker keeps every record: it has no retention
    and no DeleteRecords), and of the job's changelog: none, or one whose processor 0 has
    a marker at ``marked`` input positions."""

    def __init__(self, marked: dict[tuple[str, int], int] | None = None) -> None:
        self.marked = marked

    async def high_watermarks(self, topic: str, partitions: list[int]) -> dict[int, int]:
        return dict.fromkeys(partitions, 1000)

    async def log_start_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]:
        return {p: 500 if p == 2 else 0 for p in partitions}

    async def partition_count(self, topic: str) -> int | None:
        return None if self.marked is None else 64

    async def read(self, topic: str, partition: int, offset: int, **_: Any) -> tuple[list[Any], int]:
        if self.marked is None or partition != 0:
            return [], 0
        head = Marker("b-1", None, 1, Checkpoint(positions=self.marked, extra={"p": 2}), -1)
        return [SimpleNamespace(offset=0, key=MARKER_PREFIX + b"b-1", value=head.encode(), headers=[])], 1


def test_scale_refuses_when_the_history_a_bootstrap_needs_is_gone(tmp_path: Path) -> None:
    from streamkit.cli import CliError
    from streamkit.cli.scale import _check_history

    app = streamkit.App("trunc", state_dir=tmp_path)
    app.table("seen")
    shapes = {"t": (None, 4)}
    # 2 -> 3: processor 2 rebuilds from partitions 0 and 2 (where its keys are): refused
    with pytest.raises(CliError) as refused:
        asyncio.run(_check_history(_TruncatedTopic(), app, 2, 2, 3, shapes))  # type: ignore[arg-type]
    assert str(refused.value) == (
        "cannot scale trunc to 3 processors: the input history that processor 2's state is rebuilt from is gone "
        "(t[2] starts at offset 500, the store is at 0); seed its store from a copy of the history with a Spark "
        "backfill (streamkit backfill)"
    )
    # with a changelog whose processor 0 (where processor 2's keys come from) has a marker
    # beyond what is gone, the bootstrap starts there: allowed, and said
    paths = asyncio.run(_check_history(_TruncatedTopic({("t", 0): 700, ("t", 2): 650}), app, 2, 2, 3, shapes))  # type: ignore[arg-type]
    assert paths == [
        "processor 2 bootstraps from processor 0's changelog, then the input from its last marker on "
        "(1,350 input records not read again)"
    ]
    # a marker below what is gone does not help
    with pytest.raises(CliError):
        asyncio.run(_check_history(_TruncatedTopic({("t", 0): 700, ("t", 2): 400}), app, 2, 2, 3, shapes))  # type: ignore[arg-type]
    # 3 -> 4 (processor 3: partitions 1 and 3) needs none of what is gone
    asyncio.run(_check_history(_TruncatedTopic(), app, 2, 3, 4, shapes))  # type: ignore[arg-type]
    # a store seeded up to offset 600 of partition 2 (a backfill) needs none of it either
    with RocksDBStore.open(str(app.store_path(2)), ["seen"]) as store:
        store.commit({}, Checkpoint(positions={("t", 2): 600, ("t", 0): 400}))
    asyncio.run(_check_history(_TruncatedTopic(), app, 2, 2, 3, shapes))  # type: ignore[arg-type]


def test_log_start_offsets_are_read_from_the_broker(broker: str) -> None:
    from streamkit.kafkaio import KafkaIO
    from streamkit.testing import create_topic, produce_json, unique_topic_name

    topic = create_topic(broker, unique_topic_name("log-start"), 2)
    produce_json(broker, topic, [(f"k{i}", {"i": i}) for i in range(20)])

    async def read() -> dict[int, int]:
        async with KafkaIO(broker) as io:
            return await io.log_start_offsets(topic, [0, 1])

    assert asyncio.run(read()) == {0: 0, 1: 0}
