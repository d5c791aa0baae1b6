"""The README's global-table example, run as it stands (its asserts are the test)."""

from __future__ import annotations

import re

from tests.runtime.jobs import ROOT


def test_the_readmes_global_table_example_runs() -> None:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- global tables:[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert m is not None, "README lost its global-table example"
    exec(compile(m.group(1), "README.md (Global tables)", "exec"), {"__name__": "readme_global"})
