"""The controller's own bookkeeping around the policy, driven with scripted looks (no
broker: the policy and the actions are the real ones; the real loop against a job is in
test_status.py and test_step_load.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from streamkit.autoscale.controller import Controller, Gauge
from streamkit.autoscale.policy import Limits, Policy, Sample
from streamkit.autoscale.signals import Look, replay


def look(at: float, workers: int, processors: int, *, settled: bool = True) -> Look:
    return Look(at, 0, 0, {}, {}, {}, workers, processors, settled, 1)


def sample(at: float, workers: int, processors: int, input_rate: float, per_worker: float = 1_000.0) -> Sample:
    """A sample of a job whose workers apply ``per_worker`` records/s each at full load."""
    applied = min(input_rate, per_worker * workers)
    return Sample(at, workers, processors, input_rate, applied, 0, applied / (per_worker * workers))


class ScriptedSampler:
    """Looks from a script: a (look, sample) pair, or an exception the look raises."""

    def __init__(self, script: list[Any], stop: asyncio.Event) -> None:
        self.script, self.stop, self.restarts = list(script), stop, 0

    def restart(self) -> None:
        self.restarts += 1

    async def look(self) -> tuple[Look, Sample | None]:
        step = self.script.pop(0)
        if not self.script:
            self.stop.set()
        if isinstance(step, Exception):
            raise step
        return step


def controller(
    limits: Limits, lever: Gauge, requests: list[int], lines: list[str], record: Path | None = None
) -> Controller:
    async def request_scale(n: int) -> None:
        requests.append(n)

    app: Any = SimpleNamespace(name="orders")
    return Controller(app, Any, Policy(limits), lever, request_scale, say=lines.append, interval=0.001, record=record)


def run(c: Controller, script: list[Any]) -> ScriptedSampler:
    async def main() -> ScriptedSampler:
        stop = asyncio.Event()
        sampler = ScriptedSampler(script, stop)
        await c.run(stop, sampler)  # type: ignore[arg-type]
        return sampler

    return asyncio.run(main())


def low(at: float, workers: int = 5, processors: int = 5) -> tuple[Look, Sample]:
    """A look whose sample needs fewer workers than there are (1,000 records/s, 1 needed)."""
    return look(at, workers, processors), sample(at, workers, processors, 500.0)


def test_with_the_gauge_the_processors_do_not_follow_a_worker_the_cluster_has_yet_to_stop_back_up() -> None:
    """After a scale-in the processors shrink first and the gauge drops; the cluster stops
    the pod some time later, and until then the heartbeats still show it."""
    gauge, requests, lines = Gauge(), [], []
    c = controller(Limits(1, 6, 1, stabilization=20), gauge, requests, lines)
    script: list[Any] = [low(0), low(10), low(20)]  # in: 4 workers, 4 processors
    script += [low(t, 5, 4) for t in (30, 40)]  # the shrink settled; the 5th pod still runs
    run(c, script)
    assert requests == [4], lines
    assert gauge.desired == 4
    assert [line.split(":")[0] for line in lines] == ["hold", "hold", "in", "hold", "hold"]


def test_the_gauge_starts_within_max() -> None:
    gauge: Gauge = Gauge()
    c = controller(Limits(1, 6, 1), gauge, [], [])
    run(c, [(look(0, 8, 8), None)])  # more pods than --max when the controller starts
    assert gauge.desired == 6


def test_a_failed_look_starts_the_rates_and_the_stabilization_time_again() -> None:
    """Looks that fail (the broker away) must not count towards a scale-in, nor be
    averaged into the next sample's rates."""
    limits = Limits(1, 6, 1, stabilization=60)
    requests: list[int] = []
    lines: list[str] = []
    c = controller(limits, Gauge(), requests, lines)
    script: list[Any] = [low(t) for t in range(0, 30, 10)]
    script += [ConnectionError("broker away")] * 6  # 30 s to 85 s
    script += [low(t) for t in range(90, 160, 10)]
    sampler = run(c, script)
    decided = [line.split(":")[0] for line in lines if not line.startswith("look failed")]
    assert decided == ["hold"] * 9 + ["in"], lines  # the scale-in 60 s after the looks came back (150 s)
    assert requests == [4]
    assert sampler.restarts == 6


def test_a_history_with_failed_looks_replays_to_the_decisions_made_live(tmp_path: Path) -> None:
    record = tmp_path / "history.jsonl"
    limits = Limits(1, 6, 1, stabilization=60)
    c = controller(limits, Gauge(), [], [], record=record)
    script: list[Any] = [low(t) for t in range(0, 30, 10)]
    script += [ConnectionError("broker away")] * 6
    script += [low(t) for t in range(90, 160, 10)]
    run(c, script)
    live = [(d.at, d.action) for d in c.decisions]
    assert ("look_failed" in record.read_text()) and live[-1] == (150, "in")
    assert [(d.at, d.action) for d in replay(record.read_text().splitlines(), limits)] == live


def test_a_restarted_controller_goes_on_from_its_journal() -> None:
    """Published anew as the workers running, the gauge would have the cluster stop the
    pods it was starting for the last scale-out, and a refused scale be asked again at once."""
    from streamkit.autoscale.journal import Entry

    def entry(at: float, action: str, workers: int, refused: str | None = None, dry_run: bool = False) -> Entry:
        decision = {"action": action, "workers": workers, "processors": workers, "why": "", "figures": {}}
        return Entry("orders", at, {"dry_run": dry_run}, {}, decision, refused)

    gauge: Gauge = Gauge()
    c = controller(Limits(1, 6, 1, retry_after=30), gauge, [], [])
    journal = [entry(10, "out", 5), entry(20, "hold", 5), entry(25, "out", 6, dry_run=True)]
    journal.append(entry(30, "out", 6, refused="the job is already scaling"))
    said = c.resume(journal)
    assert said == (
        "resumed from the journal: the gauge at 5 workers (decided out), a refused scale's pause "
        "(the job is already scaling)"
    )
    assert c.policy.pausing(55) and not c.policy.pausing(61)
    run(c, [(look(40, 3, 5), None)])  # 3 pods up so far
    assert gauge.desired == 5
    assert controller(Limits(1, 6, 1), Gauge(), [], []).resume([]) is None
