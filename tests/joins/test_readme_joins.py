"""The join examples of docs/guides/tables-and-joins.md, run as they stand (their asserts are the tests)."""

from __future__ import annotations

import re

import pytest

from tests.runtime.jobs import ROOT


@pytest.mark.parametrize("block", ["joins", "stream joins"])
def test_the_readmes_join_examples_run(block: str) -> None:
    text = (ROOT / "docs/guides/tables-and-joins.md").read_text()
    m = re.search(rf"<!-- {block}:[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert m is not None, f"docs/guides/tables-and-joins.md lost its {block} example"
    exec(compile(m.group(1), f"docs/guides/tables-and-joins.md ({block})", "exec"), {"__name__": "readme_joins"})
