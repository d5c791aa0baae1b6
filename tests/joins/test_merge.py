"""The time-ordered merge's rules, on plain records (the merge is pure logic; the worker
tests run it against the broker)."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest

from streamkit.joins.merge import LONG_WAIT_SECONDS, TimeMerge
from tests.joins.merge_fakes import FakeRoute as R
from tests.joins.merge_fakes import Proc, Rec


def never(_pid: int, _source: tuple[str, int]) -> bool:
    return False


def flat(runs: list[Any]) -> list[tuple[str, int]]:
    return [(r.topic, r.offset) for _, rebuild, deliver in runs for r in (*rebuild, *deliver)]


def recs(topic: str, stamps: list[int]) -> list[Rec]:
    return [Rec(topic, 0, i, ts) for i, ts in enumerate(stamps)]


def setup(idle_ms: int = 0) -> tuple[TimeMerge, R, R]:
    merge = TimeMerge(idle_ms)
    proc = Proc(0)
    merge.set_inputs([(0, ("a", 0)), (0, ("b", 0))])
    return merge, R(proc, ("a", 0)), R(proc, ("b", 0))


def test_heads_go_out_by_timestamp_then_topic_and_a_caught_up_empty_topic_holds_nothing_back() -> None:
    merge, a, b = setup()
    merge.hold(a, [], recs("a", [1, 5, 9]))
    merge.hold(b, [], recs("b", [2, 5, 7]))
    runs = merge.release(0.0, never)
    assert flat(runs) == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("b", 2), ("a", 2)]
    assert merge.held == 0 and a.proc.pending == {("a", 0): {0, 1, 2}, ("b", 0): {0, 1, 2}}  # until applied
    for run in runs:
        merge.applied(run)
    assert a.proc.pending == {("a", 0): set(), ("b", 0): set()}


def test_a_lagging_topic_holds_the_others_and_held_records_are_pending() -> None:
    merge, a, b = setup()
    merge.hold(a, [], recs("a", [1, 2, 3]))
    lagging = lambda _pid, source: source == ("b", 0)  # noqa: E731
    assert merge.release(0.0, lagging) == []
    assert a.proc.pending[("a", 0)] == {0, 1, 2}
    merge.hold(b, [], recs("b", [2]))
    runs = merge.release(0.1, lagging)
    assert flat(runs) == [("a", 0), ("a", 1), ("b", 0)]  # a's 2 waits: b may bring a 2
    merge.applied(runs[0])
    assert a.proc.pending[("a", 0)] == {2}
    assert flat(merge.release(0.2, never)) == [("a", 2)]


def test_the_idle_wait_holds_for_a_topic_with_nothing_then_lets_go() -> None:
    merge, a, _ = setup(idle_ms=500)
    merge.hold(a, [], recs("a", [1]))
    assert merge.release(10.0, never) == []
    assert merge.release(10.4, never) == []
    assert flat(merge.release(10.5, never)) == [("a", 0)]


def test_minus_one_never_waits_and_a_lagging_partition_is_waited_for_however_long(
    caplog: pytest.LogCaptureFixture,
) -> None:
    merge, a, _ = setup(idle_ms=-1)
    merge.hold(a, [], recs("a", [1]))
    assert flat(merge.release(0.0, lambda *_: True)) == [("a", 0)]
    merge, a, b = setup()
    merge.hold(a, [], recs("a", [1]))
    assert merge.release(0.0, lambda *_: True) == []
    with caplog.at_level(logging.WARNING, logger="streamkit.joins.merge"):
        assert merge.release(LONG_WAIT_SECONDS - 0.1, lambda *_: True) == []
        assert merge.long_waits == 0 and not caplog.records
        assert merge.release(LONG_WAIT_SECONDS, lambda *_: True) == []  # told, and still waiting
        assert merge.release(100 * LONG_WAIT_SECONDS, lambda *_: True) == []
    assert merge.long_waits == 1  # once per wait
    assert [r.getMessage() for r in caplog.records] == [
        "processor 0 waits for b[0]: it has records not fetched yet and brought none for 5 s (its other inputs "
        "wait with it: going on would judge its records late)"
    ]
    merge.hold(b, [], recs("b", [3]))  # b brought one: a's goes out, and b's next wait is a new one
    assert flat(merge.release(100 * LONG_WAIT_SECONDS, lambda *_: True)) == [("a", 0)]
    merge.hold(a, [], [Rec("a", 0, 1, 4)])
    assert flat(merge.release(100 * LONG_WAIT_SECONDS, lambda *_: True)) == [("b", 0)]
    assert merge.release(200 * LONG_WAIT_SECONDS, lambda *_: True) == []
    assert merge.long_waits == 2
    assert flat(merge.release(200 * LONG_WAIT_SECONDS, never)) == [("a", 1)]  # b no longer lags


def test_runs_keep_a_routes_rebuilt_records_before_its_delivered_ones() -> None:
    merge, a, b = setup()
    merge.hold(a, recs("a", [1, 2]), [Rec("a", 0, 2, 3)])
    merge.hold(b, [], recs("b", [9]))
    runs = merge.release(0.0, never)
    assert [(r is a, [x.offset for x in rb], [x.offset for x in dl]) for r, rb, dl in runs] == [
        (True, [0, 1], [2]),
        (False, [], [0]),
    ]


def test_flush_and_drop() -> None:
    merge, a, b = setup()
    merge.hold(a, [], recs("a", [3]))
    assert flat(merge.release(0.0, lambda *_: True, flush=True)) == [("a", 0)]
    merge.hold(b, [], recs("b", [3]))
    merge.drop(0)
    assert merge.held == 0 and merge.release(0.0, never) == []


def test_the_partitions_of_one_topic_are_merged_as_topics_are() -> None:
    """A processor reading two partitions of one topic applies their records by time too
    (each partition in its offset order): which partition a fetch brought first decides
    nothing, and a partition with unfetched records holds the other back."""
    merge, proc = TimeMerge(0), Proc(0)
    merge.set_inputs([(0, ("a", 0)), (0, ("a", 1))])
    p0, p1 = R(proc, ("a", 0)), R(proc, ("a", 1))
    merge.hold(p0, [], [Rec("a", 0, i, ts) for i, ts in enumerate([1, 4, 9])])
    assert merge.release(0.0, lambda _pid, source: source == ("a", 1)) == []  # partition 1 lags
    merge.hold(p1, [], [Rec("a", 1, i, ts) for i, ts in enumerate([2, 3])])
    runs = merge.release(0.0, never)
    assert [(r.partition, r.offset) for _, _, d in runs for r in d] == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2)]


def test_a_single_input_processor_is_not_merged() -> None:
    merge = TimeMerge(0)
    merge.set_inputs([(0, ("a", 0)), (1, ("a", 0)), (1, ("b", 0))])
    assert not merge.merges(R(Proc(0), ("a", 0)))
    assert merge.merges(R(Proc(1), ("a", 0)))


def test_random_arrivals_give_the_order_of_the_whole_streams() -> None:
    """However the fetches cut the streams, the released order is the heads-merge of the
    whole streams (what a run with everything fetched at once gives)."""
    rng = random.Random(7)
    for _ in range(200):
        streams = {t: recs(t, [rng.randrange(50) for _ in range(rng.randrange(1, 12))]) for t in ("a", "b", "c")}
        whole = TimeMerge(0)
        proc = Proc(0)
        whole.set_inputs([(0, (t, 0)) for t in streams])
        for t, rs in streams.items():
            whole.hold(R(proc, (t, 0)), [], rs)
        expected = flat(whole.release(0.0, never))
        merge = TimeMerge(0)
        proc = Proc(0)
        merge.set_inputs([(0, (t, 0)) for t in streams])
        routes = {t: R(proc, (t, 0)) for t in streams}
        cursor = dict.fromkeys(streams, 0)
        out: list[tuple[str, int]] = []
        while any(cursor[t] < len(rs) for t, rs in streams.items()):
            t = rng.choice([t for t, rs in streams.items() if cursor[t] < len(rs)])
            n = rng.randrange(1, 4)
            merge.hold(routes[t], [], streams[t][cursor[t] : cursor[t] + n])
            cursor[t] += n
            short = {topic for topic, rs in streams.items() if cursor[topic] < len(rs)}
            out += flat(merge.release(0.0, lambda _p, source, short=short: source[0] in short))
        out += flat(merge.release(0.0, never))
        assert out == expected


def test_a_passed_idle_wait_holds_nothing_back_until_the_quiet_topic_brings_a_record() -> None:
    """Kafka Streams' deadline: once it passed, a quiet topic does not hold every later
    batch back again; a record from it starts a fresh wait for its next silence."""
    merge, a, b = setup(idle_ms=500)
    merge.hold(a, [], recs("a", [1]))
    assert merge.release(10.0, never) == []
    assert flat(merge.release(10.5, never)) == [("a", 0)]
    merge.hold(a, [], [Rec("a", 0, 1, 2)])
    assert flat(merge.release(20.0, never)) == [("a", 1)]  # b still quiet: no new wait
    merge.hold(b, [], recs("b", [3]))
    assert merge.release(20.1, never) == []  # now a is the quiet one: b waits for it
    assert flat(merge.release(20.6, never)) == [("b", 0)]
    merge.hold(a, [], [Rec("a", 0, 2, 4)])
    assert merge.release(30.0, never) == []  # b brought a record since: it gets its wait again
    assert flat(merge.release(30.5, never)) == [("a", 2)]


def test_a_batch_passes_unheld_only_when_nothing_could_come_before_it() -> None:
    merge, a, b = setup()
    assert merge.passes(a, 0.0, never)
    assert not merge.passes(a, 0.0, lambda _pid, source: source == ("b", 0))  # b has unfetched records
    merge.hold(b, [], recs("b", [5]))
    assert not merge.passes(a, 0.0, never)  # b holds a record: a's go through the merge
    idle, a2, _ = setup(idle_ms=500)
    assert not idle.passes(a2, 0.0, never) and idle.passes(a2, 0.5, never)


def test_records_that_pass_unheld_end_their_topics_silence_too() -> None:
    merge, a, b = setup(idle_ms=500)
    merge.hold(a, [], recs("a", [1]))
    assert merge.release(10.0, never) == []  # b quiet: its wait starts
    assert flat(merge.release(10.5, never)) == [("a", 0)]
    assert not merge.passes(b, 11.0, never)  # now a is quiet: b's records would wait for it
    assert merge.passes(b, 11.5, never)  # a's wait passed: b's go through at once, unheld
    merge.hold(a, [], [Rec("a", 0, 1, 5)])
    assert merge.release(20.0, never) == []  # b brought records since its wait: a fresh one
