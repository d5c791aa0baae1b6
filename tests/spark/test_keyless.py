"""Rows without a key: dropped and counted by the placing tasks, refused by the driver
(the end-to-end refusal, through the CLI and a real Spark job, is in
``test_backfill_refusals``)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from streamkit.errors import ConfigError
from streamkit.spark.keyless import Keyless, KeylessInput, KeylessTally, counted, drop_keyless, refuse_or_count


def _batches() -> list[pa.RecordBatch]:
    keys = [["a", None, "b"], [None, None, "c", None], ["d"]]
    return [
        pa.RecordBatch.from_pydict(
            {"key": k, "value": [{"amount": i} for i in range(len(k))], "partition": [0] * len(k)}
        )
        for k in keys
    ]


def test_keyless_rows_are_dropped_counted_and_sampled() -> None:
    seen = Keyless()
    kept = list(drop_keyless(_batches(), "key", seen))
    assert [r["key"] for b in kept for r in b.to_pylist()] == ["a", "b", "c", "d"]
    assert (seen.rows, seen.keyless) == (8, 4)
    assert seen.samples == [
        {"value": {"amount": 1}, "partition": 0},
        {"value": {"amount": 0}, "partition": 0},
        {"value": {"amount": 1}, "partition": 0},
    ]


class _Accumulator:
    """What Spark does with a task's update: merge it with the parameter."""

    def __init__(self) -> None:
        self.param, self.value = KeylessTally(), KeylessTally().zero({})

    def add(self, update: dict) -> None:
        self.value = self.param.addInPlace(self.value, update)


def test_a_task_run_twice_counts_once_and_the_driver_refuses_with_the_callers_names() -> None:
    acc = _Accumulator()
    for _ in range(2):  # a stage run again (recomputed): the same (input, partition) key
        out = list(counted(lambda spec, batches: iter(list(batches)), acc, 3, "key", "spec", iter(_batches())))
        assert sum(b.num_rows for b in out) == 4
    assert refuse_or_count(acc.value, {3: KeylessInput("h", "customer")}, allow=True) == (8, 4)
    source = KeylessInput("the history", "customer", {"value": None, "partition": "part"})
    with pytest.raises(ConfigError) as err:
        refuse_or_count(acc.value, {3: source}, allow=False)
    msg = str(err.value)
    assert msg.startswith(
        "the history: 4 of 8 rows have no key (column 'customer' is null), e.g. {'amount': 1, 'part': 0}"
    )
    assert "allow_skipped=True" in msg
