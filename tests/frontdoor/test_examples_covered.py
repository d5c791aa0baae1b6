"""Every module in ``examples/`` is run by a test on a small input, so that none can break
unnoticed (the demo once did for days). This names the test that runs each, checks that
the test does run it, and fails for an example nobody runs."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RUN_BY = {
    "demo": ("tests/frontdoor/test_demo.py", "scripts/demo"),  # scripts/demo is python -m examples.demo
    "order_producer": ("docs/getting-started.md", "python -m examples.order_producer"),
    "orders": ("docs/getting-started.md", "streamkit worker examples.orders:app"),
    "page_views": ("docs/getting-started.md", "python examples/page_views.py"),
    "purchases": ("docs/guides/backfill.md", "python -m examples.purchases"),
}
"""Per example module: the test (or the page a test runs as written) that runs it, and
the command there that does."""


def test_every_example_is_run_by_a_test() -> None:
    modules = {p.stem for p in (ROOT / "examples").glob("*.py") if p.stem != "__init__"}
    assert modules == set(RUN_BY), f"examples without a test that runs them: {sorted(modules - set(RUN_BY))}"
    for module, (where, command) in RUN_BY.items():
        assert command in (ROOT / where).read_text(), f"{where} no longer runs examples/{module}.py ({command!r})"
    assert "examples.demo" in (ROOT / "scripts" / "demo").read_text()
    pages = {where for where, _ in RUN_BY.values() if where.startswith("docs/")}
    runners = {"docs/getting-started.md": "tests/frontdoor/test_getting_started.py",
               "docs/guides/backfill.md": "tests/spark/test_backfill_guide.py"}  # fmt: skip
    for page in pages:
        assert page in (ROOT / runners[page]).read_text(), f"{runners[page]} no longer runs {page}"
