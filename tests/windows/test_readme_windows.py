"""The windows guide's example (docs/guides/windows.md), run as it stands (its asserts are the test)."""

from __future__ import annotations

import re

from tests.runtime.jobs import ROOT


def test_the_readmes_windows_example_runs() -> None:
    text = (ROOT / "docs/guides/windows.md").read_text()
    m = re.search(r"<!-- windows:[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert m is not None, "docs/guides/windows.md lost its windows example"
    exec(compile(m.group(1), "docs/guides/windows.md", "exec"), {"__name__": "readme_windows"})
