"""The harness's medians: what a speed goal stated as a ratio is judged on (pure logic)."""

from __future__ import annotations

import io

from rich.console import Console

from benchmarks.report import medians, print_medians


def _row(name: str, rps: float | None, status: str = "ok") -> dict:
    return {"contender": name, "steady_rps": rps, "status": status}


def test_medians_take_each_repeated_contender_in_first_run_order_and_leave_out_single_and_failed_runs() -> None:
    rows = [
        _row("streamkit", 90.0),
        _row("quix", 17.0),
        _row("raw", 200.0),  # run once: no median
        _row("streamkit", 110.0),
        _row("quix", 15.0),
        _row("streamkit", 80.0),
        _row("quix", None, "failed"),  # measured nothing: not a run
        _row("quix", 16.0),
    ]
    assert medians(rows) == [
        {"contender": "streamkit", "runs": 3, "median": 90.0, "low": 80.0, "high": 110.0},
        {"contender": "quix", "runs": 3, "median": 16.0, "low": 15.0, "high": 17.0},
    ]


def test_the_medians_table_gives_the_ratio_of_the_medians() -> None:
    out = io.StringIO()
    rows = [_row("a", 100.0), _row("b", 20.0), _row("a", 120.0), _row("b", 24.0)]
    print_medians(medians(rows), Console(file=out, width=200))
    text = out.getvalue()
    assert "5.00x" in text  # 110 / 22
    assert "0.2x" in text
    out = io.StringIO()
    print_medians([], Console(file=out))
    assert out.getvalue() == ""
