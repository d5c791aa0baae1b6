"""A PostgreSQL table as a sink (psycopg 3): rows inserted, or upserted by key, in one
transaction with the sink's progress per writer (table ``streamkit_sink_progress``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

from streamkit.errors import ConfigError
from streamkit.sinks.base import Owner, Sink, SinkBatch, SinkFencedError, last_per_key

__all__ = ["PostgresSink"]

PROGRESS_TABLE = "streamkit_sink_progress"

WRITE_ATTEMPTS = 6
"""Tries of one write whose connection was lost or whose transaction the server gave up
(over some 10 s, waits growing from 0.2 s): then its error stops the worker."""

log = logging.getLogger(__name__)


class PostgresSink(Sink):
    """``PostgresSink(dsn, "sums", key=["key"])``: each row a dict of column -> value.

    ``key``: the table's primary key (or unique) columns: a row replaces the one with its
    key (``mode="upsert"``, the default with a key); without, rows are appended
    (``mode="insert"``). The table must exist; the sink creates its progress table. A
    column a row leaves out gets the table's default on insert and stays as it was on
    upsert."""

    keeps_left_out = True
    idle_in_write = 30.0
    """Seconds a write transaction may sit idle before the server ends it (a write runs its
    statements back to back: only a paused or hung worker's sits)."""

    def __init__(
        self, dsn: str, table: str, *, key: Sequence[str] = (), mode: Literal["upsert", "insert"] | None = None
    ) -> None:
        self.dsn, self.table, self.key = dsn, table, tuple(key)
        self.mode = mode or ("upsert" if self.key else "insert")
        if self.mode == "upsert" and not self.key:
            raise ValueError(f"PostgresSink({table!r}): mode='upsert' needs key=[the table's key columns]")
        self.upsert_key = self.key if self.mode == "upsert" else ()
        self._conn: Any = None
        self._opened = False
        self._columns: frozenset[str] | None = None
        """The table's columns, once opened."""

    def open(self) -> None:
        """Connect, and refuse (``ConfigError``, one line naming the sink, never the
        password) a database that cannot be reached or lacks the table or its key columns:
        a worker opens its sinks when it starts, not at its first checkpoint."""
        import psycopg
        from psycopg import sql

        where = _where(self.dsn)
        try:
            self._conn = self._connect()
        except psycopg.OperationalError as exc:
            raise ConfigError(
                f"sink {self.name!r}: cannot connect to PostgreSQL ({where}): {_first_line(exc)}"
            ) from None
        except psycopg.Error:  # (a DSN it cannot parse: the message quotes the part it choked on)
            raise ConfigError(f"sink {self.name!r}: the PostgreSQL DSN cannot be parsed ({where})") from None
        try:
            name = sql.Identifier(*self.table.split(".")).as_string(self._conn)
            columns = {
                row[0]
                for row in self._conn.execute(
                    "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
                    "AND NOT attisdropped",
                    (name,),
                )
            }
            self._columns = frozenset(columns)
            if not columns:
                raise ConfigError(
                    f"sink {self.name!r}: table {self.table!r} does not exist in {where} "
                    "(create it first: the sink creates only its progress table)"
                )
            if missing := [k for k in self.key if k not in columns]:
                raise ConfigError(f"sink {self.name!r}: table {self.table!r} has no key column {', '.join(missing)}")
            self._conn.execute(
                f"CREATE TABLE IF NOT EXISTS {PROGRESS_TABLE} (sink text, writer text, seq bigint NOT NULL, "
                "generation bigint NOT NULL DEFAULT -1, incarnation text NOT NULL DEFAULT '', "
                "PRIMARY KEY (sink, writer))"
            )
            has = f"SELECT attname FROM pg_attribute WHERE attrelid = '{PROGRESS_TABLE}'::regclass AND attnum > 0"
            found = {row[0] for row in self._conn.execute(has)}
            for column, kind in (
                ("generation", "bigint NOT NULL DEFAULT -1"),
                ("incarnation", "text NOT NULL DEFAULT ''"),
            ):
                if column not in found:  # a progress table from before the fencing (the ALTER needs its
                    self._conn.execute(f"ALTER TABLE {PROGRESS_TABLE} ADD COLUMN {column} {kind}")  # owner: if missing)
        except psycopg.Error as exc:
            self.close()
            raise ConfigError(f"sink {self.name!r}: {where}: {_first_line(exc)}") from None
        except ConfigError:
            self.close()
            raise
        self._opened = True

    def write(self, batches: Sequence[SinkBatch]) -> int:
        """The batches' rows beyond what the sink holds per writer, in one transaction with
        its progress. A connection lost or a transaction the server gave up (a restart, a
        deadlock, a transaction idle too long: ``idle_in_write``) is said in a warning and
        tried again on a new connection, up to
        ``WRITE_ATTEMPTS`` times: the write is idempotent by the batches' numbers."""
        import psycopg
        from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

        def again(state: Any) -> None:
            error = state.outcome.exception()
            log.warning("sink %r: %s: %s; connecting again, attempt %d of %d", self.name, type(error).__name__,
                        _first_line(error), state.attempt_number + 1, WRITE_ATTEMPTS)  # fmt: skip
            self.close()

        attempts = retry(
            retry=retry_if_exception_type((psycopg.OperationalError, psycopg.errors.IdleInTransactionSessionTimeout)),
            stop=stop_after_attempt(WRITE_ATTEMPTS),
            wait=wait_random_exponential(multiplier=0.2, max=5),
            before_sleep=again,
            reraise=True,
        )
        return int(attempts(self._write)(batches))

    def _write(self, batches: Sequence[SinkBatch]) -> int:
        if self._conn is None:
            if self._opened:  # (checked when opened: a connection again)
                self._conn = self._connect()
            else:
                self.open()
        conn: Any = self._conn
        written = 0
        with conn.transaction():
            cur = conn.cursor()
            done: dict[str, int] = {}
            for writer in sorted({b.writer for b in batches}):
                cur.execute(
                    f"SELECT seq, generation, incarnation FROM {PROGRESS_TABLE} WHERE sink = %s AND writer = %s "
                    "FOR UPDATE",
                    (self.name, writer),
                )
                found = cur.fetchone()
                done[writer] = found[0] if found else 0
                claimed = Owner(found[2], found[1]) if found else None
                stale = [b.owner for b in batches if b.writer == writer and b.owner and b.owner.behind(claimed)]
                if stale and claimed is not None:
                    raise SinkFencedError(
                        f"sink {self.name!r}: writer {writer} was claimed by generation {claimed.generation}: a batch "
                        f"of generation {stale[0].generation} refused (its worker was paused through a rebalance)"
                    )
            rows: list[dict[str, Any]] = []
            reached: dict[str, int] = {}
            for batch in batches:
                if batch.seq <= done[batch.writer]:
                    continue  # written before a crash: the checkpoint's rows are here already
                rows += batch.rows
                reached[batch.writer] = max(reached.get(batch.writer, 0), batch.seq)
            if self.mode == "upsert":
                rows = last_per_key(rows, self.key, keep=True)
            shapes: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}  # rows by their columns
            for row in rows:
                shapes.setdefault(tuple(row), []).append(tuple(row.values()))
            for columns, values in shapes.items():  # (a column a row leaves out: the table's default, or as it was)
                cur.executemany(self._statement(columns), values)
            written = len(rows)
            for writer, seq in reached.items():
                cur.execute(
                    f"INSERT INTO {PROGRESS_TABLE} (sink, writer, seq) VALUES (%s, %s, %s) "
                    "ON CONFLICT (sink, writer) DO UPDATE SET seq = EXCLUDED.seq",
                    (self.name, writer, seq),
                )
        return written

    def _statement(self, columns: Sequence[str]) -> Any:
        """The insert (or upsert) of rows of ``columns``."""
        from psycopg import sql

        if not columns:  # (an empty row: the table's defaults)
            return sql.SQL("INSERT INTO {} DEFAULT VALUES").format(sql.Identifier(*self.table.split(".")))
        statement = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            sql.Identifier(*self.table.split(".")),
            sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.SQL(", ").join(sql.Placeholder() * len(columns)),
        )
        if self.mode == "upsert":
            others = [c for c in columns if c not in self.key]
            statement += sql.SQL(" ON CONFLICT ({}) DO ").format(sql.SQL(", ").join(map(sql.Identifier, self.key)))
            statement += (
                sql.SQL("UPDATE SET {}").format(
                    sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in others)
                )
                if others
                else sql.SQL("NOTHING")
            )
        return statement

    def _connect(self) -> Any:
        """A connection whose write transactions the server ends when they sit idle
        (``idle_in_write``): a worker paused in one (a zombie) would else hold its writer's
        progress row, and the worker taking its processor over would wait for it as long."""
        import psycopg

        conn = psycopg.connect(self.dsn, autocommit=True)
        conn.execute(f"SET idle_in_transaction_session_timeout = {int(self.idle_in_write * 1000)}")
        return conn

    def check(self, row: dict[str, Any]) -> None:
        """See :meth:`Sink.check`: a column the table lacks (known once opened)."""
        if self._columns is not None and (unknown := [c for c in row if c not in self._columns]):
            raise ValueError(f"sink {self.name!r}: table {self.table!r} has no column {', '.join(map(repr, unknown))}")

    def claim(self, writer: str, owner: Owner) -> int:
        """See :meth:`Sink.claim`: the owner goes into the writer's progress row, which every
        write locks and checks its batches against (an owner of another incarnation replaces
        it: generations start again with a job's reset)."""
        if self._conn is None:
            self.open()
        found = self._conn.execute(
            f"INSERT INTO {PROGRESS_TABLE} AS p (sink, writer, seq, generation, incarnation) "
            "VALUES (%s, %s, 0, %s, %s) ON CONFLICT (sink, writer) DO UPDATE SET generation = CASE WHEN "
            "p.incarnation = EXCLUDED.incarnation THEN GREATEST(p.generation, EXCLUDED.generation) "
            "ELSE EXCLUDED.generation END, incarnation = EXCLUDED.incarnation RETURNING seq",
            (self.name, writer, owner.generation, owner.incarnation),
        ).fetchone()
        return int(found[0])

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


def _where(dsn: str) -> str:
    """Which database a DSN names, without its password."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        found = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - unparsable: said by the caller
        return "a DSN that cannot be parsed"
    return (
        ", ".join(f"{k} {found[k]}" for k in ("host", "port", "dbname", "user") if found.get(k))
        or "the default database"
    )


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
