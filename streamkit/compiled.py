"""Which of the hot path's modules run compiled (mypyc), and whether any build is stale.

``pip install`` compiles :data:`MODULES` to C extensions where a C compiler is present
(``setup.py``); each is also kept as the ``.py`` it is built from, which Python imports
where no extension was built. The extension, when present, is what Python imports, so an
edited ``.py`` beside an extension built before the edit would not run: :func:`build_status` names such
modules, a worker says so at start, and ``scripts/_setup`` builds them again.

At a million keys, where each record reads and dirties a key of its own, the compiled
modules gave a worker 1.15x the records/s of the pure-Python ones (``docs/benchmarks.md``).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MANIFEST", "MODULES", "SOURCES", "BuildStatus", "build_status", "log_build_status"]

MODULES = (
    "stores.cache",
    "stores.cache_changes",
    "stores.stored_keys",
    "streamkit.tables",
    "streamkit.state.changelog",
    "streamkit.runtime.dispatch",
    "streamkit.kafkaio.unpack",
)
"""The modules ``setup.py`` compiles: the per-record and per-key code of a worker (the
dispatcher's loop, tables, the write-back cache and its filter of stored keys, the
changelog's records, the loop over a fetch answer's records)."""

SOURCES = tuple(name.replace(".", "/") + ".py" for name in MODULES)
"""Their sources, from the project's root: what ``setup.py`` compiles and ``scripts/_setup``
watches. This module imports only the standard library, so that both can run it by path
(``runpy.run_path``) before the package's dependencies are installed."""


@dataclass(frozen=True)
class BuildStatus:
    compiled: tuple[str, ...]
    """Modules imported (or importable) from their extension."""
    pure: tuple[str, ...]
    """Modules that run as Python source: no extension was built for them."""
    stale: tuple[str, ...]
    """Compiled modules whose ``.py`` is not what the extension was built from."""


MANIFEST = Path(__file__).with_name(
    f"compiled-sources{importlib.machinery.EXTENSION_SUFFIXES[0].removesuffix('.so')}.json"
)
"""Written by the build beside this module: the digest of each compiled module's source,
for this interpreter's extensions (another interpreter's may sit beside them)."""


def _origin(name: str) -> str:
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__file__", None):
        return str(module.__file__)
    spec = importlib.util.find_spec(name)
    return str(spec.origin) if spec is not None and spec.origin else ""


def build_status(modules: tuple[str, ...] = MODULES, manifest: Path = MANIFEST) -> BuildStatus:
    """A module is stale when its ``.py`` is not what its extension was built from (by
    content: an extension's file time says nothing, mypyc relinks only what changed)."""
    try:
        built_from: dict[str, str] = json.loads(manifest.read_text())
    except (OSError, ValueError):
        built_from = {}
    compiled, pure, stale = [], [], []
    for name in modules:
        origin = _origin(name)
        if not origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            pure.append(name)
            continue
        compiled.append(name)
        source = Path(origin).with_name(name.rsplit(".", 1)[-1] + ".py")
        if source.exists() and hashlib.sha256(source.read_bytes()).hexdigest() != built_from.get(name):
            stale.append(name)
    return BuildStatus(tuple(compiled), tuple(pure), tuple(stale))


def log_build_status(log: logging.Logger, modules: tuple[str, ...] = MODULES, manifest: Path = MANIFEST) -> BuildStatus:
    """One line at a worker's start: a warning where the hot path runs as Python source or
    from an extension built from another version of its source, else the compiled build at
    debug level."""
    status = build_status(modules, manifest)
    if status.stale:
        log.warning(
            "compiled modules built from another version of their source, which does not run: %s; "
            "build them again (scripts/_setup, or pip install -e .)",
            ", ".join(status.stale),
        )
    if status.pure and os.environ.get("STREAMKIT_PURE_PYTHON"):
        log.info("the hot path runs as Python source (STREAMKIT_PURE_PYTHON is set)")
    elif status.pure:
        log.warning(
            "the hot path runs as Python source (slower per record): no compiled build of %s "
            "(pip install needs a C compiler and the Python headers; STREAMKIT_PURE_PYTHON=1 skips it)",
            ", ".join(status.pure),
        )
    elif not status.stale:
        log.debug("the hot path runs compiled (%d modules)", len(status.compiled))
    return status
