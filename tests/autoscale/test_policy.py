"""The autoscaler's decisions on recorded histories (pure policy, no broker): a backlog,
a steady load, a spike shorter than the stabilization time, a fall in load, a refused
scale, a scale under way; and a history as ``--record`` writes it, replayed
(``--replay``) to the same decisions."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from streamkit.autoscale.policy import Decision, Limits, Policy, Sample
from streamkit.autoscale.signals import Look, as_record, replay

LIMITS = Limits(min_workers=1, max_workers=6, initial_processors=2, catch_up=60.0, stabilization=60.0, retry_after=30.0)
PER_WORKER = 1_000.0
"""Records/s one worker applies when busy all the time (the histories below)."""


def sample(at: float, workers: int, input_rate: float, lag: int = 0, *, settled: bool = True) -> Sample:
    """A worker applying what comes, up to its capacity: busy in proportion."""
    applied = min(input_rate + lag / 10, PER_WORKER * workers)
    return Sample(at, workers, max(2, workers), input_rate, applied, lag, applied / (PER_WORKER * workers), settled)


def run(history: list[Sample], limits: Limits = LIMITS) -> list[Decision]:
    policy = Policy(limits)
    return [policy.decide(s) for s in history]


def test_a_backlog_scales_out_at_once_to_drain_it_within_the_catch_up_time() -> None:
    # 1 worker saturated, 120,000 records behind, 900/s coming: 900/0.7 + 120000/60 = 3286/s
    decisions = run([sample(0, 1, 900, lag=120_000)])
    assert [(d.action, d.workers, d.processors) for d in decisions] == [("out", 4, 4)]
    assert decisions[0].why.startswith("backlog")
    assert decisions[0].figures["capacity/worker"] == pytest.approx(PER_WORKER)


def test_a_steady_load_within_the_band_holds() -> None:
    decisions = run([sample(t, 2, 1_200) for t in range(0, 600, 10)])  # 1200 / 0.7 = 1714/s: 2 workers
    assert {d.action for d in decisions} == {"hold"}
    assert all(d.workers == 2 and d.why == "capacity matches the load" for d in decisions)


def test_a_spike_shorter_than_the_stabilization_time_scales_out_and_does_not_flap_back() -> None:
    low = [sample(t, 2, 1_200) for t in range(0, 60, 10)]
    spike = [sample(60, 2, 3_000, lag=5_000)]
    after = [sample(t, 5, 1_200) for t in range(70, 120, 10)]  # 50 s of low load: shorter than 60 s
    decisions = run(low + spike + after)
    assert [d.action for d in decisions].count("out") == 1
    assert decisions[len(low)].workers == 5  # 3000/0.7 + 5000/60 = 4369/s
    assert {d.action for d in decisions[len(low) + 1 :]} == {"hold"}


def test_after_the_stabilization_time_of_low_load_it_scales_in_one_worker_at_a_time() -> None:
    history = [sample(t, 5, 600) for t in range(0, 200, 10)]  # 600 / 0.7 = 857/s: one worker would do
    decisions = run(history)
    ins = [d for d in decisions if d.action == "in"]
    assert [(d.at, d.workers, d.processors) for d in ins] == [(60, 4, 4), (130, 4, 4)]
    # (the history keeps 5 workers: each scale-in waits a whole stabilization time again)
    assert decisions[1].why == "needs fewer workers for 10 s of 60"


def test_a_sample_that_needs_every_worker_starts_the_stabilization_time_again() -> None:
    history = [sample(t, 6, 600) for t in range(0, 50, 10)] + [sample(50, 6, 3_800)]  # 5429/s: 6 workers
    history += [sample(t, 6, 600) for t in range(60, 130, 10)]
    decisions = run(history)
    assert [(d.at, d.action, d.workers) for d in decisions if d.action != "hold"] == [(120, "in", 5)]


def test_never_below_the_initial_processors_nor_outside_min_and_max() -> None:
    idle = [Sample(t, 3, 3, 0.0, 0.0, 0, 0.0) for t in range(0, 130, 10)]
    decisions = run(idle)
    assert [(d.workers, d.processors) for d in decisions if d.action == "in"] == [(2, 2)]
    flood = run([sample(0, 1, 50_000, lag=10_000_000)])
    assert (flood[0].workers, flood[0].processors) == (6, 6)


def test_nothing_while_a_scale_or_rebalance_is_under_way_and_the_wait_starts_again_after() -> None:
    history = [sample(0, 5, 600), sample(30, 5, 600, settled=False)] + [sample(t, 5, 600) for t in range(40, 120, 10)]
    decisions = run(history)
    assert decisions[1].why == "a scale, bootstrap, restore or rebalance is under way"
    assert [d.at for d in decisions if d.action == "in"] == [100]  # 60 s after the scale settled


def test_a_refused_scale_is_retried_after_a_pause_not_in_a_loop() -> None:
    policy = Policy(LIMITS)
    first = policy.decide(sample(0, 1, 900, lag=120_000))
    assert first.action == "out"
    policy.refused(1, "the job is already scaling to 3 processors")
    waits = [policy.decide(sample(t, 1, 900, lag=120_000)) for t in (5, 15, 25)]
    assert {d.action for d in waits} == {"hold"}
    assert "refused (the job is already scaling to 3 processors)" in waits[0].why
    assert policy.decide(sample(31, 1, 900, lag=120_000)).action == "out"


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="min 3 and max 2 workers"):
        Limits(min_workers=3, max_workers=2, initial_processors=1)
    with pytest.raises(ValueError, match="target utilization 1.5"):
        Limits(min_workers=1, max_workers=2, initial_processors=1, target_utilization=1.5)
    for times, says in (
        ({"catch_up": 0.0}, "--catch-up 0.0: need a number of seconds > 0"),
        ({"catch_up": -60.0}, "--catch-up -60.0"),
        ({"stabilization": float("nan")}, "--stabilization nan: need a number of seconds >= 0"),
        ({"retry_after": -1.0}, "--retry-after -1.0: need a number of seconds >= 0"),
    ):
        with pytest.raises(ValueError, match=says):
            Limits(min_workers=1, max_workers=2, initial_processors=1, **times)


def test_a_recorded_history_replays_to_the_decisions_made_live_and_other_options_change_them(tmp_path: Path) -> None:
    history = [sample(0, 1, 300)] + [sample(t, 1, 2_000, lag=t * 1_000) for t in range(10, 40, 10)]
    history += [sample(t, 3, 300) for t in range(40, 120, 10)]
    live = Policy(dataclasses.replace(LIMITS, initial_processors=1))
    lines = []
    for i, s in enumerate(history):
        look = Look(s.at, high=0, committed=0, handler_s={}, checkpoint_s={}, handled={}, workers=s.workers,
                    processors=s.processors, settled=True, initial_processors=1)  # fmt: skip
        decision = live.decide(s)
        lines.append(json.dumps(as_record(look, s, decision)))
        if i == 1:  # the scale it asked for was refused
            live.refused(s.at, "the job is already scaling")
            lines.append(json.dumps({"at": s.at, "refused": "the job is already scaling"}))
    recorded = [json.loads(line)["decision"] for line in lines if "decision" in line]
    replayed = replay(lines, LIMITS)
    assert [dataclasses.asdict(d) for d in replayed] == recorded
    assert [d.action for d in replayed].count("out") == 1 and "in" in [d.action for d in replayed]
    slower = replay(lines, dataclasses.replace(LIMITS, stabilization=300.0))
    assert "in" not in [d.action for d in slower]
