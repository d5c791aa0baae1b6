"""The harness's medians: what a speed goal stated as a ratio is judged on (pure logic)."""

from __future__ import annotations

import io

from rich.console import Console

from benchmarks.report import medians, print_medians


def _row(name: str, rps: float | None, status: str = "ok") -> dict:
    return {"contender": name, "steady_rps": rps, "status": status}


def test_medians_take_each_repeated_contender_in_first_run_order_and_only_its_correct_runs() -> None:
    rows = [
        _row("streamkit", 90.0),
        _row("quix", 17.0),
        _row("raw", 200.0),  # run once: no median
        _row("streamkit", 110.0),
        _row("quix", 15.0),
        _row("streamkit", 80.0),
        _row("quix", None, "failed"),  # measured nothing: not a run
        _row("quix", 1_000.0, "wrong"),  # its totals were wrong: its speed does not count
        _row("quix", 16.0),
    ]
    assert medians(rows) == [
        {"contender": "streamkit", "runs": 3, "median": 90.0, "low": 80.0, "high": 110.0},
        {"contender": "quix", "runs": 3, "median": 16.0, "low": 15.0, "high": 17.0},
    ]


def test_the_medians_table_gives_each_row_the_ratio_of_its_median_to_each_columns() -> None:
    rows = [_row("a", 100.0), _row("b", 20.0), _row("a", 120.0), _row("b", 30.0), _row("a", 200.0), _row("b", 10.0)]
    out = io.StringIO()
    print_medians(medians(rows), Console(file=out, width=200))
    cells = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in out.getvalue().splitlines()
        if line.startswith("│")
    }
    # runs, median, low, high, vs a, vs b: 120 / 20 (a mean would give 140 / 20 = 7.00x)
    assert cells["a"] == ["3", "120", "100", "200", "-", "6.00x"]
    assert cells["b"] == ["3", "20", "10", "30", "0.17x", "-"]
    out = io.StringIO()
    print_medians([], Console(file=out))
    assert out.getvalue() == ""


def test_a_contender_from_another_checkout_runs_the_same_variant() -> None:
    """``raw-rocksdb@DIR`` is raw-rocksdb run from DIR: its process must not see another
    name (the raw contender picks its variant by it, and ran as plain raw)."""
    from benchmarks.launch import contender_env

    assert contender_env("raw-rocksdb@/tmp/before", 60)["BENCH_CONTENDER"] == "raw-rocksdb"
    assert contender_env("streamkit-nowrite", 60)["BENCH_CONTENDER"] == "streamkit-nowrite"


def test_the_report_names_the_runs_whose_steady_window_holds_fewer_than_three_checkpoints() -> None:
    """A million keys read once are over in 3 s: a job checkpointing every 2 s has its last
    checkpoint after its last record, and a rate from such a window leaves it out."""
    from benchmarks.report import print_report

    def run(name: str, seconds: float) -> dict:
        result = {"records": 1_000, "first_record_at": 100.0, "last_record_at": 100.0 + seconds}
        return {**_row(name, 1_000 / seconds), "result": result, "cpu_s": 1.0, "peak_rss_mb": 1.0,
                "load_avg_1m_before": 0.0, "check": "ok"}  # fmt: skip

    out = io.StringIO()
    print_report([run("short", 2.9), run("long", 9.0)], "header", Console(file=out, width=250))
    text = out.getvalue()
    assert "steady windows under 6 s (short) hold fewer than three checkpoints" in text
    assert "2.9" in text and "9.0" in text  # each run's steady window, in its own column
    out = io.StringIO()
    print_report([run("long", 9.0)], "header", Console(file=out, width=250))
    assert "fewer than three checkpoints" not in out.getvalue()
