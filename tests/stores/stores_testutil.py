"""Helpers shared by the stores tests (a uniquely named module, not conftest,
so that importing it cannot pick up another directory's conftest)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PYTHON = sys.executable


def subprocess_env() -> dict[str, str]:
    """Environment for child Python processes: the repo importable, no output buffering surprises."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    return env
