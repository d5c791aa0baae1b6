"""The README's first command, ``scripts/demo``, run as a new user runs it: the embedded
broker, the generated orders, two worker processes, ``status``, and the demo's own check of
every customer's totals and window against a reference. It must exit 0 and say OK."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_scripts_demo_runs_end_to_end_and_checks_itself() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_") or k == "STREAMKIT_BASE_PYTHON"}
    done = subprocess.run(
        [str(ROOT / "scripts" / "demo")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "OK: 200 customers' totals and 600 windows equal the reference" in " ".join(out.split()), out[-4000:]
    assert "workers" in out and "dead letters" in out, out[-4000:]
