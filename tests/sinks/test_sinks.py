"""The sinks against a real PostgreSQL server and a real Delta table: a batch is written
once per writer and checkpoint number (again after a crash: skipped), upserts keep a key's
last row, inserts append, and the progress is in the same transaction as the rows."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from streamkit.sinks.base import Sink, SinkBatch
from streamkit.sinks.delta import DeltaSink
from streamkit.sinks.outbox import SinkOutbox
from streamkit.sinks.postgres import PostgresSink


def rows_of(sink: Sink, where: Any) -> list[tuple[Any, ...]]:
    if isinstance(sink, PostgresSink):
        with psycopg.connect(where) as conn:
            return sorted(conn.execute(f"SELECT * FROM {sink.table}").fetchall())
    data = DeltaTable(where).to_pyarrow_table().to_pylist()
    return sorted(tuple(r.values()) for r in data)


@pytest.fixture(params=["postgres", "delta"])
def upsert_sink(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Sink, Any]:
    if request.param == "postgres":
        dsn = request.getfixturevalue("postgres")
        table = f"sums_{abs(hash(str(tmp_path))) % 10**8}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {table} (key text PRIMARY KEY, total bigint)")
        sink: Sink = PostgresSink(dsn, table, key=["key"])
        where: Any = dsn
    else:
        sink, where = DeltaSink(str(tmp_path / "sums"), key=["key"]), str(tmp_path / "sums")
    sink.name = f"sums-{tmp_path.name}"  # the session's database holds every test's progress
    sink.open()
    return sink, where


def test_a_checkpoints_rows_are_written_once_and_upserts_keep_the_last_row(upsert_sink: tuple[Sink, Any]) -> None:
    sink, where = upsert_sink
    first = SinkBatch("job/0", 1, [{"key": "a", "total": 1}, {"key": "b", "total": 2}, {"key": "a", "total": 3}])
    assert sink.write([first]) == 2
    assert rows_of(sink, where) == [("a", 3), ("b", 2)]
    second = SinkBatch("job/0", 2, [{"key": "b", "total": 5}])
    other = SinkBatch("job/1", 1, [{"key": "c", "total": 7}])
    assert sink.write([first, second, other]) == 2  # the first again (a restart): skipped
    assert rows_of(sink, where) == [("a", 3), ("b", 5), ("c", 7)]
    assert sink.write([second, other]) == 0
    assert rows_of(sink, where) == [("a", 3), ("b", 5), ("c", 7)]
    sink.close()


def test_a_postgres_write_that_fails_writes_neither_rows_nor_progress(postgres: str) -> None:
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("CREATE TABLE events_fail (id bigint PRIMARY KEY, what text)")
    sink = PostgresSink(postgres, "events_fail")
    sink.name = "events"
    good = SinkBatch("job/0", 1, [{"id": 1, "what": "x"}])
    bad = SinkBatch("job/1", 1, [{"id": 2, "what": "y"}, {"id": 2, "what": "again"}])  # a duplicate key
    with pytest.raises(psycopg.errors.UniqueViolation):
        sink.write([good, bad])
    assert rows_of(sink, postgres) == []
    assert sink.write([good]) == 1  # nothing of the failed transaction stayed: written now
    assert rows_of(sink, postgres) == [(1, "x")]
    sink.close()


def test_delta_appends_and_records_each_writers_transaction(tmp_path: Path) -> None:
    uri = str(tmp_path / "events")
    sink = DeltaSink(uri)
    sink.name = "events"
    batches = [SinkBatch("job/0", 1, [{"id": 1}, {"id": 2}]), SinkBatch("job/0", 2, [{"id": 3}])]
    assert sink.write(batches) == 3
    assert sink.write(batches) == 0
    table = DeltaTable(uri)
    assert sorted(r["id"] for r in table.to_pyarrow_table().to_pylist()) == [1, 2, 3]
    assert table.transaction_version("streamkit/events/job/0") == 2


def test_a_writer_that_lost_its_count_goes_on_beyond_what_the_sink_holds(upsert_sink: tuple[Sink, Any]) -> None:
    """A store rebuilt from the input has no count: numbered from 1 again, its rows would
    be skipped as held. The outbox starts beyond the sink's progress."""
    from streamkit.sinks.outbox import SinkOutbox

    sink, where = upsert_sink
    sink.write([SinkBatch("job/0", 7, [{"key": "a", "total": 1}])])
    assert sink.progress("job/0") == 7 and sink.progress("job/1") == 0
    outbox = SinkOutbox("job/0", {}, floor=sink.progress("job/0"))
    outbox.add(sink.name, {"key": "a", "total": 2})
    outbox.committed()
    asyncio.run(outbox.flush({sink.name: sink}))
    assert rows_of(sink, where) == [("a", 2)]


@pytest.mark.parametrize("mode", ["insert", "upsert"])
def test_a_postgres_row_is_written_with_every_column_it_has_whatever_the_first_row_had(
    postgres: str, mode: str
) -> None:
    """The columns were the first row's: a later row's own column was dropped without a
    word, and a row lacking one of them failed every checkpoint after it."""
    table = f"notes_{mode}"
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, k text, note text DEFAULT 'none')")
        conn.execute(f"INSERT INTO {table} VALUES (3, 'c', 'kept')")
    sink = PostgresSink(postgres, table, key=["id"], mode=mode)  # type: ignore[arg-type]
    sink.name = f"notes-{mode}"
    sink.open()
    rows = [{"id": 1, "k": "a"}, {"id": 2, "k": "b", "note": "IMPORTANT"}]
    if mode == "upsert":
        rows.append({"id": 3, "k": "C"})  # a row without `note` leaves it as it was
    assert sink.write([SinkBatch("job/0", 1, rows)]) == len(rows)
    assert rows_of(sink, postgres) == [
        (1, "a", "none"),
        (2, "b", "IMPORTANT"),
        (3, "C" if mode == "upsert" else "c", "kept"),
    ]
    sink.close()


def test_a_delta_row_is_written_with_every_column_it_has_whatever_the_first_row_had(tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path / "notes"))
    sink.name = "notes"
    rows = [{"id": 1, "k": "a"}, {"id": 2, "k": "b", "note": "IMPORTANT"}]
    assert sink.write([SinkBatch("job/0", 1, rows)]) == 2
    assert sorted(DeltaTable(str(tmp_path / "notes")).to_pyarrow_table().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "k": "a", "note": None},
        {"id": 2, "k": "b", "note": "IMPORTANT"},
    ]


def test_a_postgres_sink_that_cannot_be_served_is_refused_when_opened_in_one_line_without_the_password(
    postgres: str,
) -> None:
    from streamkit.errors import ConfigError

    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute('CREATE TABLE "Keyed" (id bigint PRIMARY KEY, v text)')
    cases = [
        (PostgresSink(postgres, "no_such_table"), "sink 'out': table 'no_such_table' does not exist in host"),
        (PostgresSink(postgres, "Keyed", key=["key"]), "sink 'out': table 'Keyed' has no key column key"),
        (PostgresSink("postgresql://bob:s3cret@127.0.0.1:1/db", "t"), "sink 'out': cannot connect to PostgreSQL"),
        (PostgresSink("postgresql://bob:my%pass@127.0.0.1:1/db", "t"), "sink 'out': the PostgreSQL DSN cannot be"),
    ]
    for sink, says in cases:
        sink.name = "out"
        with pytest.raises(ConfigError) as refused:
            sink.open()
        line = str(refused.value)
        assert says in line and "\n" not in line and "s3cret" not in line and "my%pass" not in line, line
    ok = PostgresSink(postgres, "Keyed", key=["id"])  # a quoted (mixed-case) name is found as written
    ok.name = "out"
    ok.open()
    ok.close()


def test_a_postgres_write_whose_connection_was_lost_is_said_and_tried_again_once_connected(
    postgres: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A server restart or an administrator ending the sink's session must not stop the
    worker: the write is idempotent by the batches' numbers, so it is tried again."""
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("CREATE TABLE dropped (id bigint PRIMARY KEY)")
    sink = PostgresSink(postgres, "dropped")
    sink.name = "dropped"
    sink.open()
    assert sink.write([SinkBatch("job/0", 1, [{"id": 1}])]) == 1
    with psycopg.connect(postgres, autocommit=True) as admin:  # the sink's session ends under it
        backend = sink._conn.info.backend_pid
        admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
    with caplog.at_level(logging.WARNING, logger="streamkit.sinks.postgres"):
        assert sink.write([SinkBatch("job/0", 1, [{"id": 1}]), SinkBatch("job/0", 2, [{"id": 2}])]) == 1
    assert rows_of(sink, postgres) == [(1,), (2,)]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("sink 'dropped': AdminShutdown: terminating connection"), said
    assert "attempt 2 of 6" in said[0]
    sink.close()


@pytest.fixture(params=["postgres", "delta"])
def upsert_notes(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Sink, Any]:
    """An upsert sink of rows (key, total, note), the Delta table written once first (its
    schema)."""
    if request.param == "postgres":
        dsn = request.getfixturevalue("postgres")
        table = f"notes_{abs(hash(str(tmp_path))) % 10**8}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {table} (key text PRIMARY KEY, total bigint, note text)")
        sink: Sink = PostgresSink(dsn, table, key=["key"])
        where: Any = dsn
    else:
        where = str(tmp_path / "notes")
        sink = DeltaSink(where, key=["key"])
    sink.name = f"notes-{tmp_path.name}"
    sink.open()
    sink.write([SinkBatch("app/9", 1, [{"key": "z", "total": 0, "note": "schema"}])])
    return sink, where


@pytest.mark.parametrize("together", [True, False])
def test_an_upsert_of_rows_that_leave_columns_out_does_not_depend_on_how_they_were_batched(
    upsert_notes: tuple[Sink, Any], together: bool
) -> None:
    """A key's rows of one checkpoint, or of several written at once (a restart writes the
    pending batches together), end as they would written one after another: in PostgreSQL
    a column a row leaves out stays as it was, in Delta it is null."""
    sink, where = upsert_notes
    first = SinkBatch("app/1", 1, [{"key": "b", "total": 2, "note": "y"}])
    second = SinkBatch("app/1", 2, [{"key": "b", "total": 3}])
    if together:
        sink.write([first, second])
    else:
        sink.write([first])
        sink.write([second])
    outbox = SinkOutbox(
        "app/0", {}, 0, {sink.name: ("key",)}, keeping=frozenset({sink.name} if sink.keeps_left_out else ())
    )
    outbox.add(sink.name, {"key": "a", "total": 1, "note": "x"})
    outbox.add(sink.name, {"key": "a", "total": 4})  # one checkpoint's two rows of a key
    outbox.committed()
    asyncio.run(outbox.flush({sink.name: sink}))
    kept = isinstance(sink, PostgresSink)
    assert rows_of(sink, where) == [
        ("a", 4, "x" if kept else None),
        ("b", 3, "y" if kept else None),
        ("z", 0, "schema"),
    ]


def test_a_postgres_row_with_a_column_the_table_lacks_is_refused_when_the_handler_writes_it(postgres: str) -> None:
    """Refused at ``ctx.write`` (the handler fails: its record is a dead letter), not at the
    checkpoint, whose rows the sink would then refuse at every try. An empty row takes the
    table's defaults."""
    from streamkit.context import Context, Outbox

    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("CREATE TABLE checked (id bigserial PRIMARY KEY, k text)")
    sink = PostgresSink(postgres, "checked")
    sink.name = "checked"
    sink.open()
    outbox = Outbox()
    ctx = Context(outbox)
    ctx.processor = 0
    with pytest.raises(ValueError, match="sink 'checked': table 'checked' has no column 'nope'"):
        ctx.write(sink, {"k": "a", "nope": 1})
    ctx.write(sink, {"k": "b"})
    assert outbox.rows == [(0, "checked", {"k": "b"})]
    assert sink.write([SinkBatch("job/0", 1, [{"k": "b"}, {}])]) == 2
    assert rows_of(sink, postgres) == [(1, "b"), (2, None)]
    sink.close()


def test_a_claimed_writer_refuses_the_batches_of_an_older_generation(upsert_sink: tuple[Sink, Any]) -> None:
    """A zombie (a worker paused through a rebalance) writing after the new owner claimed
    its processor: refused, so its batch cannot take the number of the new owner's next.
    Generations are compared within a job incarnation only (a reset starts them again)."""
    from streamkit.sinks.base import Owner, SinkFencedError

    sink, where = upsert_sink
    assert sink.write([SinkBatch("job/0", 1, [{"key": "a", "total": 1}], Owner("i1", 1))]) == 1
    assert sink.claim("job/0", Owner("i1", 3)) == 1  # the new owner (generation 3) takes the processor
    with pytest.raises(SinkFencedError, match="writer job/0 was claimed by generation 3: a batch of generation 1"):
        sink.write([SinkBatch("job/0", 2, [{"key": "a", "total": 9}], Owner("i1", 1))])
    assert sink.claim("job/0", Owner("i1", 2)) == 1  # an older claim changes nothing
    with pytest.raises(SinkFencedError):
        sink.write([SinkBatch("job/0", 2, [{"key": "a", "total": 9}], Owner("i1", 2))])
    assert sink.write([SinkBatch("job/0", 2, [{"key": "a", "total": 2}], Owner("i1", 3))]) == 1
    assert sink.write([SinkBatch("job/1", 1, [{"key": "b", "total": 5}])]) == 1  # another writer, unfenced
    assert sink.claim("job/0", Owner("i2", 1)) == 2  # the job reset: its generations start again
    assert sink.write([SinkBatch("job/0", 3, [{"key": "a", "total": 3}], Owner("i2", 1))]) == 1
    assert rows_of(sink, where) == [("a", 3), ("b", 5)]
    assert sink.progress("job/0") == 3


def test_a_progress_table_from_before_the_fencing_is_brought_up_to_date_when_opened(postgres: str) -> None:
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA old_progress")
        conn.execute(
            "CREATE TABLE old_progress.streamkit_sink_progress (sink text, writer text, seq bigint NOT NULL, "
            "PRIMARY KEY (sink, writer))"
        )
        conn.execute("INSERT INTO old_progress.streamkit_sink_progress VALUES ('old', 'job/0', 4)")
        conn.execute("CREATE TABLE old_progress.rows (id bigint)")
    dsn = f"{postgres} options='-c search_path=old_progress'"
    sink = PostgresSink(dsn, "rows")
    sink.name = "old"
    sink.open()
    assert sink.progress("job/0") == 4
    from streamkit.sinks.base import Owner

    assert sink.claim("job/0", Owner("i1", 2)) == 4
    sink.close()
    with psycopg.connect(postgres, autocommit=True) as conn:  # another app's role, not the table's owner
        conn.execute("CREATE ROLE old_app LOGIN")
        conn.execute("GRANT USAGE, CREATE ON SCHEMA old_progress TO old_app")
        conn.execute(
            "GRANT SELECT, INSERT, UPDATE ON old_progress.streamkit_sink_progress, old_progress.rows TO old_app"
        )
    other = PostgresSink(f"{dsn} user=old_app", "rows")
    other.name = "old"
    other.open()  # the columns are there: nothing to alter (an ALTER needs the table's owner)
    assert other.claim("job/0", Owner("i1", 3)) == 4
    other.close()


def test_a_write_transaction_left_idle_by_a_paused_worker_does_not_hold_the_claim_back(postgres: str) -> None:
    """A zombie paused inside its write holds its writer's progress row; the server ends
    that transaction once idle (``idle_in_write``), so the new owner's claim goes through,
    and the zombie, resumed, finds its connection gone and its batch refused."""
    from streamkit.sinks.base import Owner, SinkFencedError

    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("CREATE TABLE idle (id bigint)")
    zombie, owner = PostgresSink(postgres, "idle"), PostgresSink(postgres, "idle")
    for sink in (zombie, owner):
        sink.name, sink.idle_in_write = "idle", 0.5
        sink.open()
    assert zombie.claim("job/0", Owner("i", 1)) == 0
    held = zombie._conn
    held.execute("BEGIN")
    held.execute("SELECT seq FROM streamkit_sink_progress WHERE sink = 'idle' AND writer = 'job/0' FOR UPDATE")
    claimed: list[int] = []  # the zombie's write, paused here; the new owner claims
    claiming = threading.Thread(target=lambda: claimed.append(owner.claim("job/0", Owner("i", 2))), daemon=True)
    claiming.start()
    claiming.join(10)
    try:
        assert claimed == [0], "the claim waited for the paused transaction"
        with pytest.raises(SinkFencedError):  # resumed: a new connection, then refused
            zombie.write([SinkBatch("job/0", 1, [{"id": 1}], Owner("i", 1))])
    finally:
        zombie.close()  # (ends the transaction if the server did not)
        claiming.join(10)
        owner.close()
