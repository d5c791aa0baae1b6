"""Random histories of a job whose input a plain producer writes too: every record is
applied exactly once or dead-lettered, every key's state is exact and on one processor.

Each history (``tests/runtime/histories.py``) is a seeded random sequence of steps run
with real processes: writes by streamkit's, aiokafka's and confluent-kafka's producers,
topic expansions, shrinks and finish-drains, worker restarts, SIGKILLs, lost stores and
processor scale steps. CI runs a short budget; more on demand:

    STREAMKIT_HISTORIES=40 STREAMKIT_HISTORY_STEPS=12 scripts/test tests/runtime/test_random_histories.py

``STREAMKIT_HISTORY_SEED`` picks the first seed (a failure names its seed and steps, and
``STREAMKIT_HISTORY_SEED=<seed> STREAMKIT_HISTORIES=1`` replays it). Without a budget,
CI runs two seeds (kills, expansions, shrinks, drains, every producer); the other kinds of
step have tests of their own.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.runtime.histories import PLAIN, PRODUCERS, plan_history, run_history, verify

CI_SEEDS = (6,)
"""Without a budget given: an expansion, then a SIGKILL (6). Others on demand
(``STREAMKIT_HISTORIES=N``), e.g. expand, shrink and finish-drain with two workers and all
three producers (8; the layout soak test runs that shape in CI), a plain
topic (no layout) written by confluent-kafka, lost stores and 2 -> 4 processors (3),
which the plain-topic strays, changelog restore and scaling tests cover one by one."""
FIRST = int(os.environ.get("STREAMKIT_HISTORY_SEED", "0"))
COUNT = os.environ.get("STREAMKIT_HISTORIES")
SEEDS = range(FIRST, FIRST + int(COUNT)) if COUNT else CI_SEEDS
STEPS = int(os.environ.get("STREAMKIT_HISTORY_STEPS", "6"))


def test_plans_cover_every_kind_of_step_and_producer() -> None:
    """The generator reaches every step and producer (over a hundred seeds), and is a
    function of its seed."""
    plans = [plan_history(seed, 12) for seed in range(100)]
    kinds = {s.kind for h in plans for s in h.steps}
    producers = {s.arg[0] for h in plans for s in h.steps if s.kind == "produce"}
    assert kinds == {"produce", "expand", "shrink", "finish-drain", "restart", "kill", "lose-stores", "scale", "settle"}
    assert producers == set(PRODUCERS)
    assert {h.capacity if not isinstance(h.capacity, int) else "capacity" for h in plans} == {None, PLAIN, "capacity"}
    assert all(isinstance(h.capacity, int) for h in plans for s in h.steps if s.kind == "expand")
    assert plan_history(7, 12) == plan_history(7, 12)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_history_applies_every_record_once(seed: int, broker: str, tmp_path: Path) -> None:
    verify(run_history(broker, tmp_path, plan_history(seed, STEPS)))
