"""Which windows a record joins, and the settings each kind refuses (pure functions)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import streamkit
from streamkit.windows import Count, Hopping, Session, Sliding, Tumbling, Window, sliding


def test_settings_are_checked_with_a_line_that_names_them() -> None:
    with pytest.raises(ValueError, match="retention .* must be at least its grace"):
        Tumbling(60, grace=30, retention=10)
    with pytest.raises(ValueError, match="advance must be > 0 and at most its size"):
        Hopping(60, 90)
    with pytest.raises(ValueError, match="gap must be > 0"):
        Session(0)
    with pytest.raises(TypeError, match="merge must be a function"):
        Session(5, merge=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="step must be an integer from 1 to n"):
        Count(3, 4)
    with pytest.raises(ValueError, match="Sliding window size must be > 0"):
        Sliding(0)
    with pytest.raises(TypeError, match="reduce must be a function"):
        Sliding(5, reduce=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("declare", "says"),
    [
        (lambda: Tumbling(0.0004), "Tumbling window size must be at least 0.001 seconds"),
        (lambda: Hopping(1, 0.0004), "Hopping window advance must be at least 0.001 seconds"),
        (lambda: Sliding(0.0004), "Sliding window size must be at least 0.001 seconds"),
        (lambda: Session(0.0004), "Session window gap must be at least 0.001 seconds"),
        (lambda: Tumbling(float("nan")), "Tumbling window size must be at least 0.001 seconds"),
        (lambda: Tumbling(float("inf")), "Tumbling window size must be at least 0.001 seconds"),
        (lambda: Tumbling(60, grace=float("nan")), "grace must be >= 0 seconds"),
        (lambda: Tumbling(60, retention=float("nan")), "retention must be a finite number of seconds"),
        (lambda: Tumbling(60, retention=float("inf")), "Tumbling window retention must be a finite number of seconds"),
        (lambda: Session(5, retention=float("inf")), "Session window retention must be a finite number of seconds"),
    ],
)
def test_lengths_the_runtime_cannot_place_are_refused(declare: Callable[[], object], says: str) -> None:
    """Windows are placed in whole ms: one shorter than 1 ms would divide by zero at its
    first record, so it is refused where it is declared."""
    with pytest.raises(ValueError, match=says):
        declare()
    with pytest.raises(
        TypeError, match="table 'w': window must be Tumbling, Hopping, Sliding, Session or Count, got 60"
    ):
        streamkit.App("a").table("w", window=60)  # type: ignore[arg-type]


def test_a_record_joins_every_hopping_window_that_holds_it() -> None:
    h = Hopping(10, 4)
    assert h.windows_of(12_000) == [Window(4_000, 14_000), Window(8_000, 18_000), Window(12_000, 22_000)]
    assert h.windows_of(3_000) == [Window(0, 10_000)]  # none starts before the epoch
    assert Hopping(10, 10).windows_of(12_000) == Tumbling(10).windows_of(12_000) == [Window(10_000, 20_000)]
    assert h.close_time(Window(4_000, 14_000)) == 14_000 + h.grace_ms


def test_count_windows_hold_n_records_every_step() -> None:
    assert [Count(2).windows_of(i) for i in range(4)] == [
        [Window(0, 2)], [Window(0, 2)], [Window(2, 4)], [Window(2, 4)]
    ]  # fmt: skip
    assert [Count(3, 1).windows_of(i) for i in range(4)] == [
        [Window(0, 3)],
        [Window(0, 3), Window(1, 4)],
        [Window(0, 3), Window(1, 4), Window(2, 5)],
        [Window(1, 4), Window(2, 5), Window(3, 6)],
    ]


def test_a_session_takes_records_within_its_gap_and_closes_once_past_gap_plus_grace_after_its_last() -> None:
    s = Session(5, grace=2)
    w = Window(10_000, 20_000)
    assert s.joins(w, 5_000) and s.joins(w, 25_000) and not s.joins(w, 25_001) and not s.joins(w, 4_999)
    assert s.close_time(w) == 27_001 and s.expiry_time(w) == 27_001 + s.retention_ms


def test_a_closed_session_is_kept_at_least_its_gap_whatever_its_retention() -> None:
    """A record within ``gap`` of a closed session is late while it is kept: deleted
    sooner, the record would open a session of its own."""
    s = Session(10, retention=1)
    assert s.expiry_time(Window(0, 0)) == s.close_time(Window(0, 0)) + 10_000


def test_sliding_windows_are_the_ones_records_end_and_start_both_ends_included() -> None:
    w = Sliding(10, grace=2)
    # records at 0, 4 and 10 s: each ends a window; 0 and 4 start one (a later record lies
    # in it), 10 does not (nothing after it). [0.001, 10.001] holds 4 and 10; [4.001, 14.001] 10.
    assert sliding.windows_of(w, {"t": [0, 4_000, 10_000]}) == [
        Window(-10_000, 0), Window(-6_000, 4_000), Window(0, 10_000), Window(1, 10_001), Window(4_001, 14_001)
    ]  # fmt: skip
    together = sliding.windows_of(w, {"t": [0, 10_001]})
    assert together == [Window(-10_000, 0), Window(1, 10_001)]  # 10.001 s apart: never together
    # a record at 9 s that came at stream time 20 s: the windows starting before 8 s had
    # closed (its own, [-1, 9], among them), so it joined only those from 8 s on
    late = {"t": [0, 10_001], "l": [[9_000, 8_000, -1]], "k": 1}
    assert sliding.first_open(w, 9_000, 20_000) == 8_000 and sliding.first_open(w, 9_000, -1) == -1_000
    assert sliding.windows_of(w, late) == [Window(-10_000, 0), Window(1, 10_001), Window(9_001, 19_001)]
    assert sliding.slots_in(late, Window(1, 10_001)) == [10_001] and sliding.slots_in(late, Window(8_000, 18_000)) == [
        -1,
        10_001,
    ]
    assert w.close_time(Window(0, 10_000)) == 10_000 + 1 + 2_000  # the end is the window's last millisecond
    # the latest window holding a record: the one ending with the last record within size
    # after it, or the one starting right after the last record before it
    assert w.last_end_holding(4_000, [0, 4_000, 10_000]) == 10_001
    assert w.last_end_holding(10_000, [0, 4_000, 10_000]) == 14_001
    assert w.last_end_holding(0, [0, 20_000]) == 0
