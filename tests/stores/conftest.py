"""Fixtures for the stores tests: one suite, both backends."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

# The test modules import their helpers (stores_testutil, crash_writer) by
# plain name; make that work under any pytest import mode.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
# When pytest puts tests/ on sys.path (a test module directly in tests/, with
# the default "prepend" import mode) and the repository root is not on it (the
# bare `pytest` script, unlike `python -m pytest`), `import stores` finds this
# directory as a namespace package before the editable install's finder runs.
# With the root on sys.path the real (regular) package always wins.
_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.append(_REPO)
if getattr(sys.modules.get("stores"), "__file__", "") is None:
    del sys.modules["stores"]  # the namespace package imported by mistake

from stores import MemoryStore, RocksDBStore, Store  # noqa: E402 - after the sys.path repair above

OpenStore = Callable[..., Store]


@pytest.fixture(params=["memory", "rocksdb"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def open_store(backend: str, tmp_path: Path) -> Iterator[OpenStore]:
    """``open_store(tables, name="s", **kw)`` opens (or reopens) a store of the
    current backend at ``tmp_path / name``; every store is closed at teardown."""
    opened: list[Store] = []

    def _open(tables: Sequence[str] = (), name: str = "s", **kw: object) -> Store:
        path = tmp_path / name
        store: Store
        if backend == "memory":
            store = MemoryStore.open(path, tables, **kw)  # type: ignore[arg-type]
        else:
            store = RocksDBStore.open(path, tables, **kw)  # type: ignore[arg-type]
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()
    if backend == "memory":
        for p in {s.path for s in opened}:
            if p is not None:
                MemoryStore.destroy(p)
