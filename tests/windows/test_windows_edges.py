"""Corners of windows a review found: a count table counted once per record whatever
calls it, a record that fails to decode in a key-concurrent route does not hold closes
back, the offline replay (the Spark backfill's) runs session and count tables, and a
record late for some of its hopping or sliding windows is not lost silently for them."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest

import streamkit
from streamkit.replay import Replayer
from streamkit.testing import TestDriver
from streamkit.windows import Count, Hopping, LateRecordError, Session, Sliding, Tumbling, late


def test_a_count_table_counts_each_record_once_for_every_handler_and_call() -> None:
    app = streamkit.App("counts")
    events = app.topic("events")
    per_3 = app.table("per_3", default=int, window=Count(3))

    @app.processor(events)
    def first(key: str, value: Any, ctx: streamkit.Context) -> None:
        per_3.update(key, lambda n: n + 1)
        per_3.update(f"{key}-shadow", lambda n: n)  # another key in between ...
        per_3.update(key, lambda n: n)  # ... then the same record again: not counted again

    @app.processor(events)
    def second(key: str, value: Any, ctx: streamkit.Context) -> None:
        per_3.update(key, lambda n: n + 10)

    with TestDriver(app) as driver:
        for i in range(5):
            driver.send("events", "k", {}, timestamp=i)
        # records 0-2 closed (deleted), 3-4 open: each counted once, both handlers applied
        assert driver.table("per_3") == {("k", 3): 22, ("k-shadow", 3): 0}
        book = {"w": [[3, 6, 0]], "n": 5}
        assert driver.table("per_3__windows") == {("k", 0): book, ("k-shadow", 0): book}


def test_a_record_that_fails_to_decode_does_not_hold_closes_back() -> None:
    app = streamkit.App("concurrent")
    events = app.topic("events")
    per_10s = app.table("per_10s", default=int, window=Tumbling(10, grace=0))

    @app.processor(events, concurrency=4)
    async def add(key: str, value: Any, ctx: streamkit.Context) -> None:
        await asyncio.sleep(0)
        per_10s[key] += value["n"]

    @app.on_window_close(per_10s)
    def closed(key: str, window: streamkit.Window, total: int, ctx: streamkit.Context) -> None:
        ctx.send("closes", key, {"start": window.start, "total": total})

    with TestDriver(app) as driver:
        driver.send("events", "a", {"n": 1}, timestamp=1)
        driver.send("events", "a", b"{not json", timestamp=2)  # a dead letter
        driver.send("events", "a", {"n": 2}, timestamp=25)  # closes [0, 10) and [10, 20)
        assert [r.value for r in driver.output("closes")] == [{"start": 0, "total": 1}]
        assert [d.reason for d in driver.dead_letters()] == ["value-decode"]


def test_the_offline_replay_runs_session_and_count_tables_one_key_at_a_time() -> None:
    app = streamkit.App("replayed")
    events = app.topic("events")
    visits = app.table("visits", default=int, window=Session(5))
    per_2 = app.table("per_2", default=int, window=Count(2))

    @app.processor(events)
    def add(key: str, value: Any, ctx: streamkit.Context) -> None:
        visits[key] += 1
        per_2.update(key, lambda n: n + 1)

    records = [(orjson.dumps({}), ts, 0, i) for i, ts in enumerate((1_000, 3_000, 20_000))]
    out = Replayer(app, "events").run_key(b"k", records)
    ks = visits.store_key_serde
    assert {ks.loads(k): orjson.loads(v) for k, v in out["visits"].items()} == {("k", 1_000): 2, ("k", 20_000): 1}
    assert {ks.loads(k): orjson.loads(v) for k, v in out["per_2"].items()} == {("k", 0): 2, ("k", 2): 1}


def test_sliding_windows_take_a_record_while_a_window_that_holds_it_is_open() -> None:
    """Both ends of a sliding window are included, and a window closes one millisecond
    after its end plus grace. A record joins every window holding it that is still open
    (Kafka Streams' rule): one whose own window has closed still joins the later ones,
    and the windows closed before it keep their value; it is late only when every window
    that could hold it has closed. ``t[key]`` reads the first open window holding the
    record; writes other than ``add`` are refused."""
    app = streamkit.App("sliding")
    events = app.topic("events")
    last_10s = app.table("last_10s", default=int, window=Sliding(10, grace=2))

    @app.processor(events)
    def add(key: str, value: Any, ctx: streamkit.Context) -> None:
        last_10s.add(key, value["n"])
        ctx.send("sums", key, last_10s[key])

    @app.on_window_close(last_10s)
    def closed(key: str, window: streamkit.Window, total: int, ctx: streamkit.Context) -> None:
        ctx.send("closes", key, [window.start, window.end, total])

    with TestDriver(app) as driver:
        driver.send("events", "k", {"n": 1}, timestamp=10.0)
        driver.send("events", "k", {"n": 2}, timestamp=20.0)  # 10 s apart: in one window
        driver.send("events", "k", {"n": 4}, timestamp=18.0)  # 18 + 2 = stream time: its own window is open
        driver.send("events", "k", {"n": 8}, timestamp=17.999)  # its own window closed; [8, 18] is open
        driver.send("events", "k", {"n": 16}, timestamp=7.999)  # every window holding it closed: late
        assert [r.value for r in driver.output("sums")] == [1, 3, 5, 13]
        assert [d.reason for d in driver.dead_letters()] == ["late"]
        driver.send("events", "j", {"n": 0}, timestamp=32.001)  # closes what ends by 30
        assert [r.value for r in driver.output("closes")] == [
            [0, 10_000, 1], [8_000, 18_000, 13], [10_000, 20_000, 15], [10_001, 20_001, 14],
            [18_000, 28_000, 6], [18_001, 28_001, 2],
        ]  # fmt: skip
        assert driver.windows("last_10s")[("k", 8_000)] == 13
        assert ("k", 7_999) not in driver.windows("last_10s")  # the late-ish record's own window was never open


def test_a_sliding_table_refuses_writes_but_add() -> None:
    app = streamkit.App("sliding-writes")
    events = app.topic("events")
    last_10s = app.table("last_10s", default=int, window=Sliding(10))
    per_10s = app.table("per_10s", default=int, window=Tumbling(10))
    errors: list[str] = []

    @app.processor(events)
    def write(key: str, value: Any, ctx: streamkit.Context) -> None:
        for attempt in (lambda: last_10s.__setitem__(key, 1), lambda: last_10s.update(key, int),
                        lambda: per_10s.add(key, 1)):  # fmt: skip
            try:
                attempt()
            except TypeError as exc:
                errors.append(str(exc))

    with TestDriver(app) as driver:
        driver.send("events", "k", {}, timestamp=1.0)
    assert len(errors) == 3
    assert "add the record's value with last_10s.add(key, value)" in errors[0] == errors[1]
    assert "update them with per_10s.update(key, fn)" in errors[2]


def test_a_sliding_table_keeps_a_record_while_a_record_on_time_can_share_a_window_with_it() -> None:
    """Retention shorter than size + grace: a record deleted too soon would be missing from
    the windows of the records that are still on time (a review found it)."""
    app = streamkit.App("sliding-expiry")
    events = app.topic("events")
    last_10s = app.table("last_10s", default=int, window=Sliding(10, grace=5, retention=5))

    @app.processor(events)
    def add(key: str, value: Any, ctx: streamkit.Context) -> None:
        last_10s.add(key, 1)

    with TestDriver(app) as driver:
        driver.send("events", "k", {}, timestamp=1.0)
        driver.send("events", "j", {}, timestamp=12.0)  # closes every window holding k's record at 1 s
        driver.checkpoint()  # (expiry runs at checkpoints)
        driver.send("events", "k", {}, timestamp=8.0)  # on time (8 + 5 > 12): 7 s after the first
        assert driver.windows("last_10s")[("k", -2_000)] == 2  # [-2, 8] s holds both


def test_a_record_late_for_some_hopping_windows_joins_the_others_and_the_missed_ones_are_counted_and_said(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = streamkit.App("partly-late")
    events = app.topic("events")
    per = app.table("per", default=int, window=Hopping(10, 5))  # windows [0, 10), [5, 15), [10, 20), ...

    @app.processor(events)
    def count(key: str, value: Any, ctx: streamkit.Context) -> None:
        per.update(key, lambda n: n + 1)

    @app.processor(events)
    def again(key: str, value: Any, ctx: streamkit.Context) -> None:
        per.update(key, lambda n: n + 10)  # the same record placed again: its missed windows count once

    with TestDriver(app) as driver, caplog.at_level(logging.WARNING, logger="streamkit.windows.late"):
        driver.send("events", "k", {}, timestamp=20)  # stream time 20 s: [10, 20) closed, [15, 25) open
        driver.send("events", "k", {}, timestamp=17)  # joins [15, 25) only, misses [10, 20)
        assert driver.windows("per") == {("k", 15_000): 22, ("k", 20_000): 11}
        assert (per.missed.records, per.missed.windows) == (1, 1)
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1
        assert "table 'per'" in said[0] and "events[0]@1 at 17000 ms" in said[0]
        assert "too late for 1 of its windows" in said[0] and "joined only the 1 still open" in said[0]
        driver.send("events", "k", {}, timestamp=16)  # the same again: counted, not said (one line per SAY_EVERY)
        assert (per.missed.records, per.missed.windows) == (2, 2) and len(caplog.records) == 1
        monkeypatch.setattr(late, "SAY_EVERY", 0.0)
        driver.send("events", "k", {}, timestamp=19)
        assert (per.missed.records, per.missed.windows) == (3, 3) and len(caplog.records) == 2
        assert "1 more such record(s) since the last line" in caplog.records[-1].getMessage()
        driver.send("events", "k", {}, timestamp=9)  # every window holding it closed: late, a dead letter
        assert [d.reason for d in driver.dead_letters()] == ["late"]
        assert per.missed.records == 3


def test_a_record_late_for_its_own_sliding_window_joins_the_later_ones_and_the_missed_ones_are_counted_and_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = streamkit.App("partly-late-sliding")
    events = app.topic("events")
    within = app.table("within", window=Sliding(10))

    @app.processor(events)
    def add(key: str, value: Any, ctx: streamkit.Context) -> None:
        within.add(key, 1)

    with TestDriver(app) as driver, caplog.at_level(logging.WARNING, logger="streamkit.windows.late"):
        driver.send("events", "k", {}, timestamp=0)
        driver.send("events", "k", {}, timestamp=20)  # stream time 20 s: windows ending before 20 s closed
        driver.send("events", "k", {}, timestamp=12)  # [2, 12] closed; joins [10, 20], still open
        assert driver.windows("within")[("k", 10_000)] == 2
        assert (within.missed.records, within.missed.windows) == (1, 1)
        [said] = [r.getMessage() for r in caplog.records]
        assert "table 'within'" in said and "at 12000 ms" in said and "too late for 1 of its windows" in said
        assert driver.dead_letters() == []


class _Clock:
    """What a windowed table reads of the handler's context."""

    def __init__(self, timestamp: int, stream_time: int, replaying: bool) -> None:
        self.timestamp, self.stream_time, self.replaying = timestamp, stream_time, replaying
        self.record = object()


@pytest.mark.parametrize("window", [Hopping(10, 5), Sliding(10)])
def test_a_record_handled_again_does_not_count_or_say_what_it_missed_again(
    window: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A rebuild hands records to the handlers again, their output held back
    (``Context.replaying``): what a partly late one missed was counted when first handled,
    maybe on another worker."""
    table = streamkit.App("again").table("t", default=int, window=window)

    def place(timestamp: int, stream_time: int, replaying: bool) -> None:
        table.bind(table.state_over({}, {}), _Clock(timestamp, stream_time, replaying))
        try:
            if isinstance(window, Sliding):
                table.add("k", 1)
            else:
                table.update("k", lambda n: n + 1)
        finally:
            table.bind(None)

    with caplog.at_level(logging.WARNING, logger="streamkit.windows.late"):
        place(17_000, 20_000, replaying=True)  # late for [10, 20) (or its own sliding window): handled again
        assert (table.missed.records, table.missed.windows) == (0, 0) and caplog.records == []
        place(17_000, 20_000, replaying=False)  # the same, first handled: counted and said
        assert table.missed.records == 1 and len(caplog.records) == 1


def test_a_context_is_replaying_while_its_output_is_held_back() -> None:
    from streamkit.context import Context, Outbox

    outbox = Outbox()
    ctx = Context(outbox)
    assert not ctx.replaying
    outbox.suppress = True  # as the dispatcher does while a processor's state is rebuilt
    assert ctx.replaying


def _session_app(window: Session) -> streamkit.App:
    app = streamkit.App("sessions")
    events = app.topic("events")
    sums = app.table("sums", default=int, window=window)

    @app.processor(events)
    def add(key: str, value: Any, ctx: streamkit.Context) -> None:
        sums.update(key, lambda t: t + value)

    @app.on_window_close(sums)
    def closed(key: str, window: streamkit.Window, total: int, ctx: streamkit.Context) -> None:
        ctx.send("closes", key, {"start": window.start, "end": window.end, "total": total})

    @app.on_late(sums)
    def late_record(key: str, value: Any, ctx: streamkit.Context, exc: Exception) -> None:
        ctx.send("late", key, {"value": value, "at": ctx.timestamp})

    return app


def test_a_record_exactly_gap_after_a_session_joins_it_without_grace() -> None:
    """Records at most ``gap`` apart form one session (Kafka Streams merges them too):
    the record at ``last + gap`` moves stream time there, and must not close its own
    session first and then be judged late by it."""
    with TestDriver(_session_app(Session(5))) as driver:
        driver.send("events", "k", 1, timestamp=0)
        driver.send("events", "k", 2, timestamp=5)  # exactly the gap later
        driver.send("events", "k", 4, timestamp=100)  # closes [0, 5000]
        assert [r.value for r in driver.output("late")] == []
        assert [r.value for r in driver.output("closes")] == [{"start": 0, "end": 5_000, "total": 3}]


@pytest.mark.parametrize("checkpoint_between", [False, True])
def test_a_record_within_gap_of_a_closed_session_is_late_whatever_its_retention_and_checkpoints(
    checkpoint_between: bool,
) -> None:
    """A retention shorter than the gap must not let a checkpoint delete a closed session
    while a record within its gap can still come: that record would open a session of its
    own or be late depending on when the checkpoint ran (and a rebuild, which replays
    without it, would judge it the other way)."""
    with TestDriver(_session_app(Session(10, retention=1))) as driver:
        driver.send("events", "k", 1, timestamp=0)
        driver.send("events", "other", 1, timestamp=12)  # k's session [0, 0] closes
        if checkpoint_between:
            driver.checkpoint()
        driver.send("events", "k", 5, timestamp=5)  # within the gap of the closed session
        driver.send("events", "z", 1, timestamp=100)
        assert [r.value for r in driver.output("late")] == [{"value": 5, "at": 5_000}]
        assert [r.value for r in driver.output("closes") if r.key == "k"] == [{"start": 0, "end": 0, "total": 1}]


def test_a_timer_writing_a_closed_window_is_late_and_never_closes_the_window_again() -> None:
    """A per-processor timer writes the window of the wall clock; once stream time has
    closed that window, the write is refused as late (the timer fails, said), never booked
    again as open (which closed and sent it once more after every write)."""
    app = streamkit.App("ticks")
    events = app.topic("events")
    ticks = app.table("ticks", default=int, window=Tumbling(10))

    @app.processor(events)
    def count(key: str, value: Any, ctx: streamkit.Context) -> None:
        ticks.update(key, lambda n: n + 1)

    @app.every(1.0)
    def tick(ctx: streamkit.Context) -> None:
        ticks.update("timer", lambda n: n + 1)

    @app.on_window_close(ticks)
    def closed(key: str, window: streamkit.Window, n: int, ctx: streamkit.Context) -> None:
        ctx.send("closes", key, {"start": window.start, "n": n})

    with TestDriver(app, start_time=100.0) as driver:
        driver.advance(1)  # the timer's write at 101 s: window [100 s, 110 s), stream time not yet moved
        driver.send("events", "k", 1, timestamp=500)  # closes it
        assert [r.value for r in driver.output("closes")] == [{"start": 100_000, "n": 1}]
        for _ in range(3):
            with pytest.raises(LateRecordError, match="table 'ticks': the window starting at 100000 ms closed"):
                driver.advance(1)
            driver.send("events", "k", 1, timestamp=501)
        assert [r.value for r in driver.output("closes")] == [{"start": 100_000, "n": 1}]


def test_a_timer_late_on_one_processor_still_fires_on_the_others() -> None:
    """Processor 0's stream time ran ahead (a producer's clock): its timer's write is late,
    and the timer still fires on processor 1, whose window is open; the failure is raised
    once every processor fired."""
    app = streamkit.App("ticks")
    events = app.topic("events")
    ticks = app.table("ticks", default=int, window=Tumbling(10))
    beats = app.table("beats", default=int)

    @app.processor(events)
    def count(key: str, value: Any, ctx: streamkit.Context) -> None:
        ticks.update(key, lambda n: n + 1)

    @app.every(1.0)
    def tick(ctx: streamkit.Context) -> None:
        ticks.update(f"timer-{ctx.processor}", lambda n: n + 1)
        beats[f"p{ctx.processor}"] += 1

    with TestDriver(app, processors=2, start_time=100.0) as driver:
        driver.send("events", "a", 1, timestamp=120)  # processor 0's stream time: 120 s
        driver.send("events", "b", 1, timestamp=100.5)  # processor 1's: 100.5 s
        with pytest.raises(LateRecordError, match="stream time 120000 ms"):
            driver.advance(1)
        assert driver.table("beats") == {"p1": 1}
        assert driver.windows("ticks").get(("timer-1", 100_000)) == 1


@pytest.mark.parametrize("checkpoint_between", [False, True])
def test_a_session_past_its_retention_is_gone_whether_a_checkpoint_deleted_it_or_not(checkpoint_between: bool) -> None:
    """A record within the gap of an ended session past its retention and of an open one
    joins the open one, whether a checkpoint has deleted the ended one yet or not (it was
    late without a checkpoint in between, and joined with one)."""
    with TestDriver(_session_app(Session(10, retention=30))) as driver:
        driver.send("events", "k", 1, timestamp=0)
        driver.send("events", "k", 1, timestamp=15)  # [0, 0] closes; [15, 15] opens
        for t in range(24, 100, 9):
            driver.send("events", "k", 1, timestamp=t)  # [15, 96]: stream time 96 s, [0, 0] past its retention
        if checkpoint_between:
            driver.checkpoint()
        driver.send("events", "k", 100, timestamp=7)  # within the gap of both
        assert [r.value for r in driver.output("late")] == []
        assert driver.windows("sums")[("k", 7_000)] == 110


@pytest.mark.parametrize("closed_first", [False, True])
def test_a_session_past_its_retention_is_gone_whether_its_close_fired_yet_or_not(closed_first: bool) -> None:
    """Closes fire at the end of a fetched batch: in one batch with the records that moved
    stream time past its retention, the session is still open; a rebuild that batches the
    records otherwise must decide alike."""
    from streamkit.windows import state
    from streamkit.windows.kinds import Window

    kind = Session(10, retention=30)
    data: dict[Any, Any] = {}
    sessions = state.WindowState("sums", kind, data, {})
    sessions.place("k", 0, 0)
    sessions.place("k", 15_000, 15_000)
    for t in range(24, 100, 9):
        sessions.place("k", t * 1_000, t * 1_000)
    if closed_first:  # a batch's end between: the close of [0, 0] fired
        for key, window in sessions.due(96_000):
            sessions.closed(key, window)
    assert sessions.place("k", 7_000, 96_000) == [Window(7_000, 96_000)]
