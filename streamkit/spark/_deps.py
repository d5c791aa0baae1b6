"""Optional dependencies of the Spark bridge, imported lazily with a clear error.

The core of streamkit installs without Spark; ``pip install 'streamkit[spark]'`` adds
pyspark, pyarrow and pandas. Every entry point of :mod:`streamkit.spark` that needs one
of them calls :func:`require` first, so a missing extra fails with one readable line
instead of an ``ImportError`` deep inside Spark.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from streamkit.errors import StreamkitError

EXTRA_HINT = "pip install 'streamkit[spark]'"


class SparkExtraMissing(StreamkitError, ImportError):
    """pyspark / pyarrow (the ``spark`` extra) is not installed."""


def require(module: str) -> ModuleType:
    """Import ``module`` (e.g. ``"pyspark"``, ``"pyarrow"``) or raise :class:`SparkExtraMissing`."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        raise SparkExtraMissing(
            f"the Spark bridge needs {top!r}, which is part of the 'spark' extra: {EXTRA_HINT} "
            f"({type(exc).__name__}: {exc})"
        ) from exc


def require_spark() -> None:
    """Check that everything the bridge needs on the driver is importable."""
    for name in ("pyspark", "pyarrow", "pandas"):
        require(name)
