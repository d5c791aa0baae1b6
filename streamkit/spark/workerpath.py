"""How Spark's Python workers find the user's app: the driver's import path, exported to
them, and the ``module:attr`` under which an ``App`` object can be imported again."""

from __future__ import annotations

import os
import sys

from streamkit.app import App

__all__ = ["app_ref", "worker_pythonpath"]


def worker_pythonpath() -> str:
    """The driver's import path, for the workers (existing directories only)."""
    seen: list[str] = []
    cwd = os.getcwd()
    for p in [cwd, *sys.path]:
        p = os.path.abspath(p or cwd)
        if os.path.isdir(p) and p not in seen:
            seen.append(p)
    return os.pathsep.join(seen)


def app_ref(app: App) -> str | None:
    """``module:attr`` under which ``app`` is importable (not ``__main__``)."""
    for name, module in list(sys.modules.items()):
        if module is None or name == "__main__" or name.startswith(("pyspark", "py4j", "numpy", "pandas")):
            continue
        try:
            attrs = vars(module)
        except TypeError:
            continue
        for attr, value in list(attrs.items()):
            if value is app:
                return f"{name}:{attr}"
    return None
