"""Global tables for the replay backfill: each read whole from its topic before the
replay, as a worker reads it before its processors apply a record.

The driver reads every global table of the app into a scratch copy (the worker's own
reader, ``streamkit.joins.global_store``: KIP-253 copies skipped, tombstones applied,
undecodable values deleted) and hands the tasks its stored bytes; a task's handlers look
keys up in them (:class:`HeldGlobal`). As in a worker, lookups are not ordered with the
replayed input: every record sees the table as it is when the backfill starts.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from streamkit.app import App
from streamkit.connection import Connection
from streamkit.errors import ConfigError
from streamkit.joins.global_store import GlobalStores
from streamkit.joins.global_table import GlobalTable
from streamkit.kafkaio import KafkaIO

__all__ = ["HeldGlobal", "load_global_tables"]


def load_global_tables(app: App, connection: Connection | None, scratch: Path) -> dict[str, dict[bytes, bytes]]:
    """Every global table of ``app`` read to its topic's end: per table, stored key bytes
    -> value bytes. ``scratch`` is used and removed."""
    if not app.global_tables:
        return {}
    if connection is None:
        names = ", ".join(sorted(app.global_tables))
        raise ConfigError(
            f"app {app.name!r} reads global tables ({names}), which the replay reads from their topics first: "
            "give broker="
        )
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    stores = GlobalStores(list(app.global_tables.values()), scratch)
    try:

        async def catch_up() -> None:
            async with KafkaIO(connection, client_id=f"streamkit-backfill-{app.name}") as io:
                await stores.catch_up(io)

        asyncio.run(catch_up())
        return {s.table.name: dict(s.items()) for s in stores.stores}
    finally:
        stores.close()
        shutil.rmtree(scratch, ignore_errors=True)


class HeldGlobal:
    """A global table's stored bytes, read as a worker's copy answers lookups."""

    def __init__(self, table: GlobalTable, data: Mapping[bytes, bytes]) -> None:
        self._kdumps = table.topic.key_serde.dumps
        self._vloads = table.topic.value_serde.loads
        self._data = data

    def get(self, key: Any, default: Any = None) -> Any:
        if key is None:  # a record without the foreign key: nothing to look up
            return default
        data = self._data.get(self._kdumps(key))
        return default if data is None else self._vloads(data)

    def __len__(self) -> int:
        return len(self._data)
