"""The global tables guide's example (docs/guides/global-tables.md), run as it stands (its asserts are the test)."""

from __future__ import annotations

import re

from tests.runtime.jobs import ROOT


def test_the_readmes_global_table_example_runs() -> None:
    text = (ROOT / "docs/guides/global-tables.md").read_text()
    m = re.search(r"<!-- global tables:[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert m is not None, "docs/guides/global-tables.md lost its global-table example"
    exec(compile(m.group(1), "docs/guides/global-tables.md", "exec"), {"__name__": "readme_global"})
