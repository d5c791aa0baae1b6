"""The progress log's positions of shared partitions (pure: records applied in log order)."""

from __future__ import annotations

from typing import Any

from streamkit.runtime.progress import ProgressLog


def _log() -> tuple[ProgressLog, Any]:
    log = ProgressLog(None, None, "g")  # type: ignore[arg-type]  # only _apply is used

    def rec(member: str, gen: int, parts: Any = (), shares: Any = ()) -> None:
        log._apply({"member": member, "gen": gen, "parts": list(parts), "shares": list(shares)})

    return log, rec


def test_a_shared_partition_is_at_its_lowest_sharer_once_every_sharer_reported() -> None:
    log, rec = _log()
    rec("a", 1, parts=[["t", 0, 30]])  # whole, before the job grew
    rec("a", 2, shares=[["t", 0, 0, None, [0, 1]]])  # fences: shared from generation 2
    rec("b", 2, shares=[["t", 0, 1, None, [0, 1]]])
    rec("a", 2, shares=[["t", 0, 0, 50, [0, 1]]])
    assert log.position("t", 0) == 30  # processor 1 has not reported: the floor
    assert log.position("t", 0, 0) == 50 and log.position("t", 0, 1) == 30
    rec("b", 2, shares=[["t", 0, 1, 40, [0, 1]]])
    assert log.position("t", 0) == 40 and log.positions("t") == {0: 40}
    rec("b", 2, shares=[["t", 0, 1, 70, [0, 1]]])
    assert log.position("t", 0) == 50


def test_shares_of_an_older_generation_are_rejected_and_a_new_sharer_set_starts_from_the_floor() -> None:
    log, rec = _log()
    rec("a", 2, shares=[["t", 0, 0, 50, [0, 1]], ["t", 0, 1, 45, [0, 1]]])
    assert log.position("t", 0) == 45
    rec("c", 3, shares=[["t", 0, 2, None, [0, 1, 2]]])  # a third processor shares it now
    rec("z", 2, shares=[["t", 0, 1, 99, [0, 1]]])  # a zombie of generation 2
    assert log.rejected and log.rejected[-1].member == "z"
    assert log.position("t", 0) == 45 and log.position("t", 0, 1) == 45
    rec("a", 3, shares=[["t", 0, 0, 60, [0, 1, 2]], ["t", 0, 1, 61, [0, 1, 2]]])
    assert log.position("t", 0) == 45
    rec("c", 3, shares=[["t", 0, 2, 58, [0, 1, 2]]])
    assert log.position("t", 0) == 58
    rec("a", 4, parts=[["t", 0, 80]])  # whole again (the job shrank)
    assert log.position("t", 0) == 80 and log.position("t", 0, 2) == 80


def test_the_first_sweep_end_recorded_wins_and_sweeps_are_marked() -> None:
    log = ProgressLog(None, None, "g")  # type: ignore[arg-type]  # only _apply is used
    assert log.last_commit_swept("t", 2)  # never moved
    log._apply({"member": "m", "gen": 1, "parts": [["t", 2, 40], ["t", 0, 9]], "swept": [["t", 2]]})
    assert log.last_commit_swept("t", 2) and not log.last_commit_swept("t", 0)
    log._apply({"member": "m", "gen": 2, "parts": [["t", 2, None]]})  # a fence keeps what moved it
    assert log.last_commit_swept("t", 2) and log.position("t", 2) == 40
    log._apply({"member": "a", "gen": 2, "parts": [], "sweep_ends": [["t", 2, 7, 40]]})
    log._apply({"member": "b", "gen": 2, "parts": [], "sweep_ends": [["t", 2, 7, 55], ["t", 2, 90, 95]]})
    assert log.sweep_ends("t", 2) == {7: 40, 90: 95} and log.sweep_ends("t", 0) == {}
    log._apply({"member": "m", "gen": 2, "parts": [["t", 2, 60]]})  # applied in place from there
    assert not log.last_commit_swept("t", 2)
    log._apply({"member": "m", "gen": 3, "parts": [["t", 3, 30]], "swept": [["t", 3]]})
    log._apply({"member": "m", "gen": 4, "parts": [], "shares": [["t", 3, 0, None, [0, 1]], ["t", 3, 1, None, [0, 1]]]})
    assert log.last_commit_swept("t", 3)  # shared from a sweep's position: its sharers decide the end
    log._apply({"member": "m", "gen": 4, "parts": [], "shares": [["t", 3, 0, 35, [0, 1]]]})
    assert not log.last_commit_swept("t", 3)
    log._apply({"reset": True})
    assert log.sweep_ends("t", 2) == {} and log.last_commit_swept("t", 2)


def test_where_copies_of_strays_beyond_a_swept_position_can_lie() -> None:
    """The topic's ends recorded with a swept position that has no copy beyond it; kept
    through fences, positions applied in place and sharing, until a sweep records new ones."""
    log = ProgressLog(None, None, "g")  # type: ignore[arg-type]  # _apply reads nothing
    assert log.copies_after("t", 2) is None  # never recorded: anywhere
    log._apply({"member": "m", "gen": 1, "parts": [["t", 2, 0]], "swept": [["t", 2]],
                "copies_after": [["t", 2, [[0, 50], [1, 60], [2, 0]]]]})  # fmt: skip
    assert log.copies_after("t", 2) == {0: 50, 1: 60, 2: 0}
    log._apply({"member": "m", "gen": 1, "parts": [["t", 2, 40]], "swept": [["t", 2]]})  # copies beyond it
    log._apply({"member": "n", "gen": 2, "parts": [["t", 2, None]]})
    log._apply({"member": "n", "gen": 2, "parts": [["t", 2, 45]]})
    assert log.copies_after("t", 2) == {0: 50, 1: 60, 2: 0}
    log._apply({"member": "n", "gen": 3, "parts": [], "shares": [["t", 2, 0, None, [0, 1]]]})
    assert log.copies_after("t", 2) == {0: 50, 1: 60, 2: 0}
    log._apply({"member": "n", "gen": 4, "parts": [["t", 2, 70]], "swept": [["t", 2]],
                "copies_after": [["t", 2, [[0, 80], [1, 90], [2, 70]]]]})  # fmt: skip
    assert log.copies_after("t", 2) == {0: 80, 1: 90, 2: 70} and log.copies_after("t", 3) is None


def test_a_whole_partitions_position_carries_its_committers_stream_time() -> None:
    """What a processor taking the partition over goes on from (its windows' closes up to
    there were sent by the committer); a fence keeps it, a zombie's does not replace it,
    and a shared partition has none (its sharers' times differ)."""
    log = ProgressLog(None, None, "g")  # type: ignore[arg-type]  # only _apply is used
    log._apply({"member": "a", "gen": 1, "parts": [["t", 0, 40], ["t", 1, 9]], "st": [["t", 0, 5_000]]})
    assert log.stream_time("t", 0) == 5_000 and log.stream_time("t", 1) == -1
    log._apply({"member": "b", "gen": 2, "parts": [["t", 0, None]]})  # a fence: the new owner's generation
    assert log.stream_time("t", 0) == 5_000
    log._apply({"member": "a", "gen": 1, "parts": [["t", 0, 55]], "st": [["t", 0, 9_000]]})  # a zombie: rejected
    assert log.stream_time("t", 0) == 5_000 and log.position("t", 0) == 40
    log._apply({"member": "b", "gen": 2, "parts": [["t", 0, 60]], "st": [["t", 0, 7_000]]})
    assert log.stream_time("t", 0) == 7_000
    log._apply({"member": "b", "gen": 3, "parts": [], "shares": [["t", 0, 0, 61, [0, 1]]]})
    assert log.stream_time("t", 0) == -1


def test_a_start_recorded_at_the_same_position_keeps_the_stream_time() -> None:
    log = ProgressLog(None, None, "g")  # type: ignore[arg-type]  # only _apply is used
    log._apply({"member": "a", "gen": 1, "parts": [["t", 0, 40]], "st": [["t", 0, 5_000]]})
    log._apply({"member": "b", "gen": 2, "parts": [["t", 0, 40]]})  # a new owner's start: where it was
    assert log.stream_time("t", 0) == 5_000
    log._apply({"member": "b", "gen": 2, "parts": [["t", 0, 41]]})  # moved on, with no windows
    assert log.stream_time("t", 0) == -1
