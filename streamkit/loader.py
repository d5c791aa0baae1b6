"""Resolve `MODULE:APP` strings into App objects, with one-line errors."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from streamkit.app import App
from streamkit.errors import AppLoadError


def load_app(spec: str) -> App:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppLoadError(f"expected MODULE:APP (e.g. examples.orders:app), got {spec!r}")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise AppLoadError(f"cannot import module {module_name!r} for {spec!r}: {exc}") from exc
    except Exception as exc:  # the user's module raised while importing
        raise AppLoadError(f"importing {module_name!r} for {spec!r} raised {type(exc).__name__}: {exc}") from exc
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise AppLoadError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, App):
        raise AppLoadError(f"{spec!r} is a {type(obj).__name__}, not a streamkit.App")
    return obj
