"""The state-path benchmark (``benchmarks.state_path``) on a small input: every record goes
through admission, the task and the checkpoints into the stores (its own check: every
key is in a store), and each stage is timed."""

from __future__ import annotations

from benchmarks.state_path import STAGES, fetch_answers, measure


def test_the_state_path_benchmark_applies_and_checkpoints_every_record() -> None:
    answers = fetch_answers(5000, 500, 2, 100)
    assert sum(len(r) for a in answers for r in a.values()) == 5000
    run = measure(answers, 2, 1000)
    assert run.records == 5000 and run.checkpoints == 6  # every 1,000 records and at the end
    assert 500 <= run.changelog_records <= 5000  # each changed key once per checkpoint
    assert all(run.cpu[stage] > 0 for stage in STAGES)
    # the stores start empty and the caches hold every key: the filter of stored keys answers
    # the first read of each of the 500 keys (a false positive, under 1% here, reads RocksDB)
    assert run.store_reads <= 25
