"""streamkit state stores: bytes-in/bytes-out tables with atomic checkpoints.

This package never imports ``streamkit``.  See docs/architecture.md (stores).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Checkpoint, Store, StoreClosedError, StoreError, StoreLockedError
from .cache import CachedTable, commit_cached
from .memory import MemoryStore
from .serde import IntSerde, JsonSerde, RawSerde, Serde, SerdeError, StrSerde, serde_for
from .tuning import relax_malloc_trim

if TYPE_CHECKING:
    from .rocksdb import RocksDBStore, store_options, write_sst

__all__ = [
    "CachedTable",
    "Checkpoint",
    "IntSerde",
    "JsonSerde",
    "MemoryStore",
    "RawSerde",
    "RocksDBStore",
    "Serde",
    "SerdeError",
    "Store",
    "StoreClosedError",
    "StoreError",
    "StoreLockedError",
    "StrSerde",
    "commit_cached",
    "relax_malloc_trim",
    "serde_for",
    "store_options",
    "write_sst",
]

_LAZY = {"RocksDBStore", "store_options", "write_sst"}


def __getattr__(name: str) -> Any:
    # rocksdict is imported on first use only, so MemoryStore users stay light.
    if name in _LAZY:
        from . import rocksdb

        return getattr(rocksdb, name)
    raise AttributeError(f"module 'stores' has no attribute {name!r}")
