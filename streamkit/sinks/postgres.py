"""A PostgreSQL table as a sink (psycopg 3): rows inserted, or upserted by key, in one
transaction with the sink's progress per writer (table ``streamkit_sink_progress``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from streamkit.sinks.base import Sink, SinkBatch, last_per_key

__all__ = ["PostgresSink"]

PROGRESS_TABLE = "streamkit_sink_progress"


class PostgresSink(Sink):
    """``PostgresSink(dsn, "sums", key=["key"])``: each row a dict of column -> value.

    ``key``: the table's primary key (or unique) columns: a row replaces the one with its
    key (``mode="upsert"``, the default with a key); without, rows are appended
    (``mode="insert"``). The table must exist; the sink creates its progress table."""

    def __init__(
        self, dsn: str, table: str, *, key: Sequence[str] = (), mode: Literal["upsert", "insert"] | None = None
    ) -> None:
        self.dsn, self.table, self.key = dsn, table, tuple(key)
        self.mode = mode or ("upsert" if self.key else "insert")
        if self.mode == "upsert" and not self.key:
            raise ValueError(f"PostgresSink({table!r}): mode='upsert' needs key=[the table's key columns]")
        self.upsert_key = self.key if self.mode == "upsert" else ()
        self._conn: Any = None

    def open(self) -> None:
        import psycopg

        self._conn = psycopg.connect(self.dsn, autocommit=True)
        self._conn.execute(
            f"CREATE TABLE IF NOT EXISTS {PROGRESS_TABLE} (sink text, writer text, seq bigint NOT NULL, "
            "PRIMARY KEY (sink, writer))"
        )

    def write(self, batches: Sequence[SinkBatch]) -> int:
        from psycopg import sql

        if self._conn is None:
            self.open()
        written = 0
        with self._conn.transaction():
            cur = self._conn.cursor()
            done: dict[str, int] = {}
            for writer in sorted({b.writer for b in batches}):
                cur.execute(
                    f"SELECT seq FROM {PROGRESS_TABLE} WHERE sink = %s AND writer = %s FOR UPDATE", (self.name, writer)
                )
                found = cur.fetchone()
                done[writer] = found[0] if found else 0
            rows: list[dict[str, Any]] = []
            reached: dict[str, int] = {}
            for batch in batches:
                if batch.seq <= done[batch.writer]:
                    continue  # written before a crash: the checkpoint's rows are here already
                rows += batch.rows
                reached[batch.writer] = max(reached.get(batch.writer, 0), batch.seq)
            if self.mode == "upsert":
                rows = last_per_key(rows, self.key)
            if rows:
                columns = list(rows[0])
                statement = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                    sql.Identifier(*self.table.split(".")),
                    sql.SQL(", ").join(map(sql.Identifier, columns)),
                    sql.SQL(", ").join(sql.Placeholder() * len(columns)),
                )
                if self.mode == "upsert":
                    others = [c for c in columns if c not in self.key]
                    statement += sql.SQL(" ON CONFLICT ({}) DO ").format(
                        sql.SQL(", ").join(map(sql.Identifier, self.key))
                    )
                    statement += (
                        sql.SQL("UPDATE SET {}").format(
                            sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in others)
                        )
                        if others
                        else sql.SQL("NOTHING")
                    )
                cur.executemany(statement, [tuple(row[c] for c in columns) for row in rows])
                written = len(rows)
            for writer, seq in reached.items():
                cur.execute(
                    f"INSERT INTO {PROGRESS_TABLE} (sink, writer, seq) VALUES (%s, %s, %s) "
                    "ON CONFLICT (sink, writer) DO UPDATE SET seq = EXCLUDED.seq",
                    (self.name, writer, seq),
                )
        return written

    def progress(self, writer: str) -> int:
        if self._conn is None:
            self.open()
        found = self._conn.execute(
            f"SELECT seq FROM {PROGRESS_TABLE} WHERE sink = %s AND writer = %s", (self.name, writer)
        ).fetchone()
        return int(found[0]) if found else 0

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
