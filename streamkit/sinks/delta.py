"""A Delta Lake table as a sink (the ``deltalake`` package): each write is one Delta
commit that carries, per writer, an application transaction (``txn``: app id
``streamkit/<sink>/<writer>``, version = the writer's checkpoint number), Delta's own
mechanism for idempotent writers.

Zombies are fenced with a second application transaction per writer and job incarnation
(app id ``streamkit/<sink>/<writer>/owner/<incarnation>``, version = the generation of the
worker that took the writer's processor last, ``claim``): a write refuses batches of an
older generation of that incarnation, and
carries the transaction again, so that a claim committed after the write read the table
makes the write's commit conflict (Delta refuses two concurrent commits of one app id's
transaction): it is tried again, and then refused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from streamkit.sinks.base import Owner, Sink, SinkBatch, SinkFencedError, last_per_key

__all__ = ["DeltaSink"]


class DeltaSink(Sink):
    """``DeltaSink("/data/sums", key=["key"])``: rows appended (``mode="append"``), or
    merged by key (``mode="upsert"``, the default with a key). The table is created by
    the first write if it does not exist."""

    def __init__(
        self,
        uri: str,
        *,
        key: Sequence[str] = (),
        mode: Literal["upsert", "append"] | None = None,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.uri, self.key, self.storage_options = uri, tuple(key), storage_options
        self.mode = mode or ("upsert" if self.key else "append")
        if self.mode == "upsert" and not self.key:
            raise ValueError(f"DeltaSink({uri!r}): mode='upsert' needs key=[the key columns]")
        self.upsert_key = self.key if self.mode == "upsert" else ()

    def _app_id(self, writer: str) -> str:
        return f"streamkit/{self.name}/{writer}"

    def _owner_id(self, writer: str, incarnation: str) -> str:
        return f"streamkit/{self.name}/{writer}/owner/{incarnation}"

    def claim(self, writer: str, owner: Owner) -> int:
        """See :meth:`Sink.claim` and the module docstring (a table not written yet is not
        fenced: nothing of the writer's is in it)."""
        import pyarrow as pa
        from deltalake import DeltaTable, write_deltalake
        from deltalake.exceptions import CommitFailedError, TableNotFoundError
        from deltalake.transaction import CommitProperties, Transaction
        from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

        def claim_once() -> int:
            try:
                table = DeltaTable(self.uri, storage_options=self.storage_options)
            except TableNotFoundError:
                return 0
            owner_id = self._owner_id(writer, owner.incarnation)
            claimed = table.transaction_version(owner_id)
            if claimed is None or claimed < owner.generation:
                empty = pa.Table.from_pylist([], schema=pa.schema(table.schema().to_arrow()))
                claim = CommitProperties(app_transactions=[Transaction(owner_id, owner.generation)])
                write_deltalake(table, empty, mode="append", commit_properties=claim)
            return int(table.transaction_version(self._app_id(writer)) or 0)

        again = retry(
            retry=retry_if_exception_type(CommitFailedError),
            stop=stop_after_attempt(10),
            wait=wait_random_exponential(multiplier=0.05, max=2),
            reraise=True,
        )
        return int(again(claim_once)())

    def progress(self, writer: str) -> int:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            table = DeltaTable(self.uri, storage_options=self.storage_options)
        except TableNotFoundError:
            return 0
        return int(table.transaction_version(self._app_id(writer)) or 0)

    def write(self, batches: Sequence[SinkBatch]) -> int:
        """One Delta commit (see the class docstring). Another writer's commit in between
        (workers write one table) fails it: it is tried again from the table's new version,
        transaction versions read again, up to ten times."""
        from deltalake.exceptions import CommitFailedError
        from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

        again = retry(
            retry=retry_if_exception_type(CommitFailedError),
            stop=stop_after_attempt(10),
            wait=wait_random_exponential(multiplier=0.05, max=2),
            reraise=True,
        )
        return int(again(self._write)(batches))

    def _write(self, batches: Sequence[SinkBatch]) -> int:
        import pyarrow as pa
        from deltalake import DeltaTable, write_deltalake
        from deltalake.exceptions import TableNotFoundError
        from deltalake.transaction import CommitProperties, Transaction

        try:
            table: Any = DeltaTable(self.uri, storage_options=self.storage_options)
        except TableNotFoundError:
            table = None
        done = {w: (table.transaction_version(self._app_id(w)) or 0) if table is not None else 0
                for w in {b.writer for b in batches}}  # fmt: skip
        owners = self._owners(table, batches)
        rows: list[dict[str, Any]] = []
        reached: dict[str, int] = {}
        for batch in batches:
            if batch.seq <= done[batch.writer]:
                continue  # this checkpoint's rows are in the table already
            rows += batch.rows
            reached[batch.writer] = max(reached.get(batch.writer, 0), batch.seq)
        if not reached:
            return 0
        if self.mode == "upsert":
            rows = last_per_key(rows, self.key)
        commit = CommitProperties(
            app_transactions=[Transaction(self._app_id(w), v) for w, v in sorted(reached.items())]
            + [
                Transaction(self._owner_id(w, o.incarnation), o.generation)
                for w, o in sorted(owners.items())
                if w in reached
            ]
        )
        target = None if table is None else pa.schema(table.schema().to_arrow())
        columns = dict.fromkeys([*(target.names if target else ()), *(c for row in rows for c in row)])
        data = pa.Table.from_pydict({c: [row.get(c) for row in rows] for c in columns})  # (a column a row
        if target is not None:  # leaves out: null, whatever the other rows have; of the table's type)
            data = data.cast(
                pa.schema([target.field(c) if c in target.names else data.schema.field(c) for c in columns])
            )
        if table is None:
            write_deltalake(
                self.uri, data, mode="append", storage_options=self.storage_options, commit_properties=commit
            )
        elif self.mode == "append":  # (the table as read: a claim since makes the commit conflict)
            write_deltalake(table, data, mode="append", commit_properties=commit)
        else:
            predicate = " AND ".join(f"t.{k} = s.{k}" for k in self.key)
            merger = table.merge(data, predicate, source_alias="s", target_alias="t", commit_properties=commit)
            merger.when_matched_update_all().when_not_matched_insert_all().execute()
        return len(rows)

    def _owners(self, table: Any, batches: Sequence[SinkBatch]) -> dict[str, Owner]:
        """Per writer, the owner its batches name (raises ``SinkFencedError`` when a newer
        one claimed it: see the module docstring)."""
        owners: dict[str, Owner] = {}
        for batch in batches:
            if (owner := batch.owner) is None:
                continue
            found = (
                None if table is None else table.transaction_version(self._owner_id(batch.writer, owner.incarnation))
            )
            claimed = None if found is None else Owner(owner.incarnation, int(found))
            if owner.behind(claimed):
                raise SinkFencedError(
                    f"sink {self.name!r}: writer {batch.writer} was claimed by generation {found}: a batch of "
                    f"generation {owner.generation} refused (its worker was paused through a rebalance)"
                )
            if batch.writer not in owners or owners[batch.writer].generation < owner.generation:
                owners[batch.writer] = owner
        return owners
