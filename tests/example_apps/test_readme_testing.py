"""The testing guide's example (docs/guides/testing.md), run with pytest as a user would run it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.runtime.jobs import ROOT


def test_the_readmes_testing_example_passes_under_pytest(tmp_path: Path) -> None:
    text = (ROOT / "docs/guides/testing.md").read_text()
    m = re.search(r"<!-- testing:[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert m is not None, "docs/guides/testing.md lost its testing example"
    (tmp_path / "test_users_app.py").write_text(m.group(1))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_users_app.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0 and "2 passed" in result.stdout, result.stdout + result.stderr
