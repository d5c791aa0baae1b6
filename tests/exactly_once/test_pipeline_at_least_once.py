"""The exactly-once pipeline (``test_pipeline``) with ``processing="at_least_once"``: the
same kills apply counts twice, which shows that the exactly-once test can fail. No scale
step here (``streamkit scale`` registers a producer every layout change on the broker waits
for: that one runs apart, with the scaling tests), so it runs with the other tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.exactly_once.test_pipeline import run_pipeline


def test_at_least_once_applies_counts_twice_through_the_same_kills(
    broker: str, topic_factory: Callable[..., str], tmp_path: Path, postgres: str
) -> None:
    out = run_pipeline(broker, topic_factory, tmp_path, postgres, "at_least_once", 1, rounds=1, scale=False)
    assert out.counts == dict(out.sent)  # state is exact either way
    over = {k for k, total in out.sums.items() if total > out.reference()[k]}
    assert over, "no count was applied twice: the kills did not land between a send and its checkpoint"
    assert out.pg == out.sums == out.delta  # the sinks are exactly once with B's state, whatever B read
