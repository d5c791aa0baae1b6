"""Which contenders can run here, and the venvs of those that need one of their own.

A contender named in ``benchmarks.contenders.VENVS`` (pathway) conflicts with the
project's pins: it runs with the python of ``.bench/venv-<name>``, made on first use.
Any other contender may declare ``REQUIRES = ("pkg", ...)`` at module level; those
packages must be importable here.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.contenders import REQUIRES, VENVS, module_for

ROOT = Path(__file__).resolve().parents[1]


def availability(name: str, say: Callable[[str], Any] = print) -> str | None:
    """None if contender ``name`` can run, else the reason it is skipped. A contender
    with a venv of its own gets it made here when missing (``say`` tells so)."""
    module = f"benchmarks.contenders.{module_for(name)}"
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        return f"{module}: {exc}"
    if spec is None:
        return f"no module {module}"
    if name in VENVS:  # its packages are in its own venv, not in this interpreter
        return ensure_venv(name, VENVS[name], say)
    needs = list(REQUIRES.get(name, ()))
    if spec.origin and spec.origin.endswith(".py"):
        # A contender may declare REQUIRES = ("pkg", ...) at module level; read it
        # without importing the module.
        import ast

        try:
            tree = ast.parse(Path(spec.origin).read_text())
            for node in tree.body:
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "REQUIRES" for t in node.targets
                ):
                    needs += list(ast.literal_eval(node.value))
        except (OSError, SyntaxError, ValueError):
            pass
    for package in needs:
        if importlib.util.find_spec(package) is None:
            return f"package {package!r} not installed (pip install -e '.[bench]')"
    return None


def venv_python(name: str) -> Path:
    """The python of contender ``name``'s own venv (see ``VENVS``)."""
    return ROOT / ".bench" / f"venv-{name}" / "bin" / "python"


def ensure_venv(name: str, requirements: tuple[str, ...], say: Callable[[str], Any] = print) -> str | None:
    """Make contender ``name``'s venv and install ``requirements`` into it, unless done
    already (a marker in the venv holds the requirements installed). None when it is
    ready, else the reason it is not; pip's output goes to ``.bench/venv-<name>.log``."""
    python = venv_python(name)
    venv = python.parents[1]
    marker = venv / ".bench-requirements"
    wanted = "\n".join(requirements)
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return None
    log = venv.with_name(venv.name + ".log")
    say(
        f"creating {venv.relative_to(ROOT)} for {name} (pip install {' '.join(requirements)}; "
        f"first use only, about a minute; log: {log.relative_to(ROOT)}) ..."
    )
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [] if python.exists() else [[sys.executable, "-m", "venv", str(venv)]]
    steps.append([str(python), "-m", "pip", "install", "--disable-pip-version-check", *requirements])
    with open(log, "wb") as out:
        for cmd in steps:
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode:
                return f"could not make its venv {venv.relative_to(ROOT)} (log: {log.relative_to(ROOT)})"
    marker.write_text(wanted)
    return None
