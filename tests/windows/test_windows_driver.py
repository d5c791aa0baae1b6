"""Every kind of window against the reference (``reference``): random records with
out-of-order timestamps, gaps and late ones, through the test driver (the worker's own
dispatch, stores and checkpoints): the windows held, the closes fired (each once, with
its final value) and the late records. Then the same with checkpoints and crashes at
random points: the state is exact, and a close whose output was checkpointed is never
sent again."""

from __future__ import annotations

import random
from typing import Any

import pytest

from streamkit.testing import TestDriver
from tests.windows import reference
from tests.windows.windows_app import KINDS, make_app

SEEDS = range(4)


def history(seed: int, n: int = 400, keys: int = 6) -> list[tuple[str, int, int]]:
    """``n`` records of ``keys`` keys: time mostly moves on, by bursts and gaps; one in
    six is up to 20 s older than the newest (some of those late)."""
    rng = random.Random(seed)
    now, out = 0, []
    for _ in range(n):
        now += rng.choice([0, 100, 500, 1000, 2000, 7000])
        ts = max(0, now - rng.randrange(20_000)) if rng.random() < 1 / 6 else now
        out.append((f"k{rng.randrange(keys)}", ts, rng.randrange(1, 10)))
    return out


def expected(kind: str, records: list[tuple[str, int, int]]) -> reference.Result:
    w = KINDS[kind]
    if kind == "count":
        return reference.counts(records, w.n, w.step)  # type: ignore[union-attr]
    if kind == "session":
        return reference.sessions(records, w.gap_ms, w.grace_ms)  # type: ignore[union-attr]
    if kind == "sliding":
        return reference.sliding(records, w.size_ms, w.grace_ms)  # type: ignore[union-attr]
    return reference.time_windows(records, w.size_ms, w.advance_ms, w.grace_ms)  # type: ignore[union-attr]


def closes(driver: TestDriver) -> list[tuple[str, int, int]]:
    return [(r.key, r.value["start"], r.value["total"]) for r in driver.output("closes")]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("seed", SEEDS)
def test_windows_closes_and_late_records_match_the_reference(kind: str, seed: int) -> None:
    records = history(seed)
    want = expected(kind, records)
    item_syntax = kind in ("tumbling", "session") and seed % 2 == 1  # t[key] += n as well as update
    with TestDriver(make_app(kind, item_syntax=item_syntax), processors=1) as driver:
        for key, ts, n in records:
            driver.send("events", key, {"n": n}, timestamp=ts / 1000)
        got = driver.windows("sums")
        fired = closes(driver)
        late = driver.output("late")
    assert got == want.windows
    assert len(fired) == len(set((k, s) for k, s, _ in fired)), "a close fired twice"
    assert {(k, s): t for k, s, t in fired} == want.closes
    assert len(late) == want.late and (want.late > 0 or kind == "count")
    assert want.closes, "the history closes no window: it tests nothing"


@pytest.mark.parametrize("kind", list(KINDS))
def test_crashes_at_random_points_keep_the_windows_exact_and_each_checkpointed_close_once(kind: str) -> None:
    records = history(100 + len(kind), n=600)
    want = expected(kind, records)
    rng = random.Random(7)
    committed: set[tuple[str, int]] = set()
    with TestDriver(make_app(kind), processors=1) as driver:
        for key, ts, n in records:
            driver.send("events", key, {"n": n}, timestamp=ts / 1000)
            roll = rng.random()
            if roll < 0.05:
                driver.checkpoint()
                committed = {(k, s) for k, s, _ in closes(driver)}
            elif roll < 0.08:
                before = len(closes(driver))
                driver.restart()
                again = [(k, s) for k, s, _ in closes(driver)[before:]]
                assert not committed & set(again), f"checkpointed closes fired again: {committed & set(again)}"
        got: dict[Any, Any] = driver.windows("sums")
        fired = closes(driver)
    assert got == want.windows
    assert {(k, s): t for k, s, t in fired} == want.closes  # the last value of each: the final one


def test_a_two_processor_job_closes_each_processors_windows_on_its_own_stream_time() -> None:
    from assignors.linear_hashing import partition_for_key

    records = history(42, n=500, keys=10)
    per: dict[int, list[tuple[str, int, int]]] = {}
    for r in records:
        per.setdefault(partition_for_key(r[0].encode(), 2, 2), []).append(r)
    assert len(per) == 2
    want = reference.Result()
    for part in per.values():
        one = expected("hopping", part)
        want.windows.update(one.windows)
        want.closes.update(one.closes)
    with TestDriver(make_app("hopping"), processors=2) as driver:
        for key, ts, n in records:
            driver.send("events", key, {"n": n}, timestamp=ts / 1000)
        assert dict(driver.table("sums").items()) == want.windows
        assert {(k, s): t for k, s, t in closes(driver)} == want.closes
