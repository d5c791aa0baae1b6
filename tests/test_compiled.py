"""The hot path's compiled build (setup.py, streamkit.compiled): the suite runs against it,
and an install without a C compiler goes on with the pure-Python modules and says so."""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamkit.compiled import MODULES, build_status, log_build_status

ROOT = Path(__file__).resolve().parent.parent
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def test_the_suite_runs_against_the_compiled_build() -> None:
    """What CI tests is what a user with a compiler runs: every module of the hot path
    imported from its extension, none older than its source (scripts/_setup builds them)."""
    if os.environ.get("STREAMKIT_PURE_PYTHON"):
        pytest.skip("STREAMKIT_PURE_PYTHON is set: this run tests the pure-Python modules")
    status = build_status()
    assert status.pure == () and status.stale == (), status
    for name in MODULES:
        assert str(importlib.import_module(name).__file__).endswith(SUFFIX), name


def test_the_compiled_modules_import_from_anywhere(tmp_path: Path) -> None:
    """A worker, the CLI or a Spark task started in another directory imports the same
    extensions: each package holds its own compiled group's shared library."""
    if os.environ.get("STREAMKIT_PURE_PYTHON"):
        pytest.skip("STREAMKIT_PURE_PYTHON is set: this run tests the pure-Python modules")
    code = f"import importlib; print(*(importlib.import_module(m).__file__ for m in {MODULES!r}))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    files = result.stdout.split()
    assert len(files) == len(MODULES) and all(f.endswith(SUFFIX) for f in files), files


def _copy_project(dest: Path) -> Path:
    """The project's sources without any built extension, as a fresh clone has them."""
    dest.mkdir(exist_ok=True)
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    for package in ("streamkit", "stores", "assignors"):
        shutil.copytree(
            ROOT / package,
            dest / package,
            ignore=shutil.ignore_patterns("*.so", "compiled-sources*.json", "__pycache__"),
        )
    return dest


def _build(project: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=project,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _built(project: Path) -> list[Path]:
    return sorted(project.rglob(f"*{SUFFIX}"))


def test_without_a_compiler_the_install_goes_on_with_the_python_modules(tmp_path: Path) -> None:
    """And takes away the extensions an earlier build left beside the sources (an editable
    install): Python would import them before the ``.py`` files."""
    project = _copy_project(tmp_path)
    earlier = [
        project / "stores" / f"_native__mypyc{SUFFIX}",
        project / "streamkit" / f"tables{SUFFIX}",
        project / "streamkit" / f"compiled-sources{SUFFIX.removesuffix('.so')}.json",
    ]
    for built in earlier:
        built.write_bytes(b"")
    result = _build(project, CC=str(tmp_path / "no-such-cc"))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("streamkit: WARNING")]
    assert warnings == [
        f"streamkit: WARNING: no C compiler ('{tmp_path / 'no-such-cc'}' not found); "
        "installing the pure-Python modules (slower per record)"
    ]
    assert [built for built in earlier if built.exists()] == []


def test_a_wheel_built_without_a_compiler_leaves_an_editable_trees_extensions_alone(tmp_path: Path) -> None:
    """Only a build in place (``--inplace``, an editable install) replaces what is beside the sources."""
    project = _copy_project(tmp_path)
    earlier = project / "streamkit" / f"tables{SUFFIX}"
    earlier.write_bytes(b"")
    result = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib")],
        cwd=project,
        env={**os.environ, "CC": str(tmp_path / "no-such-cc")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and "streamkit: WARNING: no C compiler" in result.stderr, result.stderr
    assert earlier.exists()


def test_the_opt_out_builds_nothing(tmp_path: Path) -> None:
    result = _build(_copy_project(tmp_path), STREAMKIT_PURE_PYTHON="1")
    assert result.returncode == 0, result.stderr
    assert "streamkit: WARNING: STREAMKIT_PURE_PYTHON is set; installing the pure-Python modules" in result.stderr
    assert _built(tmp_path) == []


def test_a_compiler_that_fails_partway_leaves_no_extension_behind(tmp_path: Path) -> None:
    """mypyc translates the modules; the C compiler builds the first package's group, then
    fails on the second's: no half-built set of extensions (a shared part without its
    package's other modules, or the reverse) is left to import."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc is not None, "the suite runs against the compiled build: it needs a C compiler"
    compiled = tmp_path / "compiled.log"
    cc = tmp_path / "cc-fails-on-streamkit"
    cc.write_text(
        f'#!/bin/sh\ncase "$*" in *build/streamkit/*) exit 1;; esac\necho "$*" >> {compiled}\nexec {gcc} "$@"\n'
    )
    cc.chmod(0o755)
    project = _copy_project(tmp_path / "project")
    result = _build(project, CC=str(cc))
    assert result.returncode == 0, result.stderr
    assert "streamkit: WARNING: compiling the hot path failed" in result.stderr
    assert "build/stores/" in compiled.read_text()  # the first group was built, then taken away
    assert _built(project) == []
    assert not list((project / "streamkit").glob("compiled-sources*.json"))


def _fake_build(tmp_path: Path, *, built_from: bytes) -> tuple[str, Path]:
    """A package with one module as both source and extension (an empty file: found, not
    loaded), and a manifest saying what the extension was built from."""
    package = tmp_path / "hotpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_bytes(b"x = 1\n")
    (package / f"mod{SUFFIX}").write_bytes(b"")
    manifest = tmp_path / "compiled-sources.json"
    manifest.write_text(json.dumps({"hotpkg.mod": hashlib.sha256(built_from).hexdigest()}))
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    return "hotpkg.mod", manifest


@pytest.fixture
def clean_path() -> Iterator[None]:
    saved = list(sys.path)
    yield
    sys.path[:] = saved
    sys.modules.pop("hotpkg", None)
    importlib.invalidate_caches()


@pytest.mark.usefixtures("clean_path")
def test_an_extension_built_from_another_source_is_named_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    name, manifest = _fake_build(tmp_path, built_from=b"x = 0\n")
    status = build_status((name,), manifest)
    assert (status.compiled, status.pure, status.stale) == ((name,), (), (name,))
    with caplog.at_level(logging.WARNING):
        log_build_status(logging.getLogger("test"), (name,), manifest)
    assert [r.getMessage() for r in caplog.records] == [
        f"compiled modules built from another version of their source, which does not run: {name}; "
        "build them again (scripts/_setup, or pip install -e .)"
    ]


@pytest.mark.usefixtures("clean_path")
def test_an_extension_built_from_its_source_is_current(tmp_path: Path) -> None:
    name, manifest = _fake_build(tmp_path, built_from=b"x = 1\n")
    assert build_status((name,), manifest).stale == ()


def test_a_worker_without_the_compiled_build_says_so(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STREAMKIT_PURE_PYTHON", raising=False)
    with caplog.at_level(logging.WARNING):
        status = log_build_status(logging.getLogger("test"), ("json.decoder",))  # a module with no extension
    assert status.pure == ("json.decoder",)
    assert [r.getMessage() for r in caplog.records] == [
        "the hot path runs as Python source (slower per record): no compiled build of json.decoder "
        "(pip install needs a C compiler and the Python headers; STREAMKIT_PURE_PYTHON=1 skips it)"
    ]
