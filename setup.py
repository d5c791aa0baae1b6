"""Builds the hot path's modules as C extensions with mypyc where a C compiler is present.

``pip install`` (and ``pip install -e .``, which ``scripts/_setup`` runs) compiles the
modules named in ``streamkit/compiled.py``: the per-record and per-key code of a worker
(the dispatcher's loop, tables, the write-back cache, the changelog's records). Each
stays importable as the ``.py`` it is built from; where no C compiler is found, or the
build fails, the install goes on with the pure-Python modules and says so (and so does a
worker at start, ``streamkit.compiled``). ``STREAMKIT_PURE_PYTHON=1`` skips the build.
"""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


_COMPILED = runpy.run_path(str(ROOT / "streamkit" / "compiled.py"))
"""``streamkit/compiled.py``, run by path: the package's dependencies are not installed yet."""


def _compiled_modules() -> list[str]:
    """The compiled modules' sources, as paths from the project's root."""
    return list(_COMPILED["SOURCES"])


_MYPY_OPTIONS = ("--config-file=", "--ignore-missing-imports", "--follow-imports=silent")
"""mypyc reads the modules' types with mypy, but not under the project's strict settings
(``pyproject.toml``; ``scripts/test`` checks those): pip builds before it installs the
dependencies, so numpy, orjson or aiokafka may be missing, and their types with them (Any:
the same C code for what mypyc compiles, which calls into them as Python objects). Only the
compiled modules' own errors count."""

_PACKAGES = ("stores", "streamkit")
"""One compiled group per top-level package: each group's shared library lives inside its
package (``stores/_native__mypyc...so``), found wherever the package is; mypyc's default,
one library named by a hash at the top level, is found only from the project's root."""


def _groups() -> list[tuple[list[str], str | None]]:
    paths = _compiled_modules()
    groups = [([p for p in paths if p.startswith(f"{package}/")], f"{package}._native") for package in _PACKAGES]
    if sum(len(group) for group, _ in groups) != len(paths):
        raise LookupError(f"a compiled module outside {', '.join(_PACKAGES)}: {paths}")
    return [(group, name) for group, name in groups if group]


_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
_MANIFEST: str = _COMPILED["MANIFEST"].name
"""One per interpreter, as the extensions are (``streamkit.compiled.MANIFEST``)."""

_IN_PLACE = bool({"--inplace", "-i", "editable_wheel", "develop"} & set(sys.argv[1:]))
"""The build puts its extensions beside the sources (``scripts/_setup``, editable installs)."""


def _warn(why: str) -> None:
    print(f"streamkit: WARNING: {why}; installing the pure-Python modules (slower per record)", file=sys.stderr)
    if _IN_PLACE:
        _remove_inplace_builds()


def _remove_inplace_builds() -> None:
    """This interpreter's extensions an earlier build left beside the sources: Python would
    import them before the ``.py`` files this build goes on with."""
    stale = [ROOT / (path[: -len(".py")] + _SUFFIX) for path in _compiled_modules()]
    shared = [built for package in _PACKAGES for built in (ROOT / package).glob(f"*__mypyc{_SUFFIX}")]
    for built in [*stale, *shared, ROOT / "streamkit" / _MANIFEST]:
        built.unlink(missing_ok=True)


def _digests() -> dict[str, str]:
    return {
        path[: -len(".py")].replace("/", "."): hashlib.sha256((ROOT / path).read_bytes()).hexdigest()
        for path in _compiled_modules()
    }


_BUILT_FROM: dict[str, str] = {}
"""The sources' digests as the translation to C read them (taken before it starts: a
source saved during the build is not what was compiled)."""


def _compiler_missing() -> str | None:
    """Why no extension can be built here, or None. The compiler's command is the one
    setuptools will run (``CC``, else the interpreter's own)."""
    if os.environ.get("STREAMKIT_PURE_PYTHON"):
        return "STREAMKIT_PURE_PYTHON is set"
    command = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()
    if not command or shutil.which(command[0]) is None:
        return f"no C compiler ({command[0] if command else 'CC'!r} not found)"
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        return "no Python headers (Python.h) for this interpreter"
    return None


class OptionalBuildExt(build_ext):
    """Builds the extensions, or, if the compiler fails, none of them (the shared part and
    each module's stub go together) and the install goes on with the ``.py`` files."""

    def copy_file(self, infile: str, outfile: str, *args: Any, **kwargs: Any) -> tuple[str, bool]:  # type: ignore[override]
        """In place (``--inplace``, editable installs), a new file renamed over the old: a
        running worker keeps the extension it loaded instead of reading a half-written one."""
        partial = f"{outfile}.partial"
        shutil.copy(infile, partial)  # with its mode
        os.replace(partial, outfile)
        return outfile, True

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any failure of the C build
            _warn(f"compiling the hot path failed ({type(exc).__name__}: {exc})")
            for ext in self.extensions:
                built = Path(self.get_ext_fullpath(ext.name))
                built.unlink(missing_ok=True)
            return
        if self.extensions:
            self._write_manifest()

    def _write_manifest(self) -> None:
        """What each extension was built from (``streamkit.compiled.MANIFEST``): the digest of
        its source, which a worker compares with the ``.py`` beside it at start."""
        manifests = [Path(self.get_ext_fullpath("streamkit.compiled")).with_name(_MANIFEST)]
        if getattr(self, "editable_mode", False):  # the extensions are copied beside the sources
            manifests.append(ROOT / "streamkit" / _MANIFEST)
        for manifest in manifests:
            manifest.write_text(json.dumps(_BUILT_FROM, indent=1, sort_keys=True) + "\n")


_BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"}
"""The commands that build extensions: pip runs this file for the metadata alone first
(``egg_info``, ``dist_info``), which needs no translation to C (about 12 s each)."""


def _extensions() -> list[Any]:
    if _BUILDS.isdisjoint(sys.argv[1:]):
        return []
    why = _compiler_missing()
    if why is not None:
        _warn(why)
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        _warn(f"mypyc is not importable ({exc})")
        return []
    os.chdir(ROOT)  # mypyc names the modules by their paths from here
    _BUILT_FROM.update(_digests())
    try:
        return list(
            mypycify([*_MYPY_OPTIONS, *_compiled_modules()], opt_level="3", debug_level="0", separate=_groups())
        )
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - mypy's own errors exit
        _warn(f"mypyc could not translate the hot path ({type(exc).__name__}: {exc})")
        return []


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
