"""`streamkit produce TOPIC [FILE]`: send JSON lines through streamkit's producer, so that
each record lands where the topic's layout places its key (a plain Kafka producer's
default partitioner knows nothing of layouts: it spreads keys over reserved partitions
too, and over the wrong ones after an expansion).

Each record needs a key (``--key-field`` or ``--key-separator``) unless ``--no-key`` says
so: keyless records are placed round robin, and an app that reads the topic with its
default key serde dead-letters every one of them. ``--timestamp-field`` sets each
record's Kafka timestamp from a field of it (else the producer's clock at sending)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import typer


def _lines(source: IO[str]) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(source, 1):
        if line.strip():
            yield number, line


def parse_line(
    line: str, key_field: str | None, separator: str | None, timestamp_field: str | None = None
) -> tuple[str | None, Any, int | None]:
    """One input line -> (key, value, timestamp ms or None). ``separator``: ``KEY<sep>JSON``;
    ``key_field``: the key is that field of the JSON object (text as it is, anything else
    as JSON); neither: no key. ``timestamp_field``: see :func:`timestamp_ms`."""
    import orjson

    key: str | None = None
    text = line.rstrip("\n")
    if separator is not None:
        key, sep, text = text.partition(separator)
        if not sep:
            raise ValueError(f"no {separator!r} separating the key from the value")
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if key_field is not None:
        found = _field(value, key_field, "key")
        key = found if isinstance(found, str) else orjson.dumps(found).decode()
    ts = timestamp_ms(_field(value, timestamp_field, "timestamp"), timestamp_field) if timestamp_field else None
    return key, value, ts


def _field(value: Any, name: str, what: str) -> Any:
    if not isinstance(value, dict):
        raise ValueError(f"a JSON {type(value).__name__}, not an object: no field {name!r} to take the {what} from")
    found = value.get(name)
    if found is None:
        why = "is null" if name in value else "is missing"
        raise ValueError(f"field {name!r} {why}: no {what} to take from it")
    return found


def timestamp_ms(raw: Any, name: str) -> int:
    """A record's timestamp from its field ``name`` (``streamkit.timestamps.to_millis``: ms
    since the epoch, or an ISO-8601 text, UTC without an offset)."""
    from streamkit.timestamps import to_millis

    return to_millis(raw, f"field {name!r}")


def produce(
    topic: str = typer.Argument(..., help="the topic to write to"),
    file: Path | None = typer.Argument(None, help="JSON lines (default: standard input)"),
    key_field: str | None = typer.Option(None, "--key-field", "-k", help="take each record's key from this field"),
    separator: str | None = typer.Option(None, "--key-separator", help="lines are KEY<SEP>JSON"),
    no_key: bool = typer.Option(
        False, "--no-key", help="write records without a key on purpose (round robin; keyed apps dead-letter them)"
    ),
    timestamp_field: str | None = typer.Option(
        None,
        "--timestamp-field",
        "-t",
        help="take each record's timestamp from this field: milliseconds since the epoch, or an ISO-8601 time "
        "(UTC without an offset); else the time of sending",
    ),
    broker: str | None = typer.Option(
        None, "--broker", "-b", envvar="STREAMKIT_BROKER", help="bootstrap address (else STREAMKIT_BROKER)"
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Send JSON lines to TOPIC through the layout-aware producer, with a progress bar.

    Each record needs a key: --key-field (or --key-separator), or --no-key to write keyless records on purpose."""
    from streamkit.cli import CliError
    from streamkit.cli.topics import _broker

    if key_field is not None and separator is not None:
        raise CliError("give --key-field or --key-separator, not both")
    if no_key and (key_field is not None or separator is not None):
        raise CliError("give --no-key or a key (--key-field, --key-separator), not both")
    if not no_key and key_field is None and separator is None:
        raise CliError(
            "the records would have no key (an app dead-letters keyless records): give --key-field FIELD to take it "
            "from a field (or --key-separator), or --no-key to write keyless records on purpose"
        )
    connection = _broker(broker)
    where = str(file) if file is not None else "<stdin>"
    if file is not None and not file.is_file():
        raise CliError(f"{where}: no such file")
    total = sum(1 for _ in _lines(file.open())) if file is not None else None
    source = file.open() if file is not None else sys.stdin
    try:
        sent, parts = asyncio.run(
            _send(connection, topic, source, where, (key_field, separator, timestamp_field), total, progress)
        )
    finally:
        if file is not None:
            source.close()
    spread = ", ".join(f"{p}: {n:,}" for p, n in sorted(parts.items()))
    typer.echo(f"{sent:,} records to {topic} (by partition: {spread or '-'})")


async def _send(
    broker: Any,
    topic: str,
    source: IO[str],
    where: str,
    fields: tuple[str | None, str | None, str | None],
    total: int | None,
    progress: bool,
) -> tuple[int, dict[int, int]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from streamkit.cli import CliError
    from streamkit.errors import TopicNotFoundError
    from streamkit.kafkaio import KafkaIO
    from streamkit.producer import Producer

    async with KafkaIO(broker) as io:
        if await io.partition_count(topic) is None:
            raise CliError(str(TopicNotFoundError(f"topic {topic!r} does not exist (streamkit topics create {topic})")))
    sent = 0
    deliveries: list[Any] = []
    parts: dict[int, int] = {}
    bar = Progress(
        TextColumn(f"[bold]{topic}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), disable=not progress
    )
    async with Producer(broker, client_id="streamkit-produce") as producer:
        with bar:
            task = bar.add_task("send", total=total)
            for number, line in _lines(source):
                try:
                    key, value, ts = parse_line(line, *fields)
                except ValueError as exc:
                    await producer.flush()
                    raise CliError(f"{where}:{number}: {exc}; {_before(sent)}") from None
                deliveries.append(await producer.send(topic, key, value, timestamp_ms=ts))
                sent += 1
                if sent % 10_000 == 0:  # count what was acknowledged so far: memory stays bounded
                    await _count(deliveries, parts)
                    bar.update(task, completed=sent)
            await producer.flush()
            await _count(deliveries, parts)
            bar.update(task, completed=sent)
    return sent, parts


def _before(sent: int) -> str:
    if sent == 0:
        return "nothing was sent"
    return f"the {sent:,} records before it were sent" if sent > 1 else "the record before it was sent"


async def _count(deliveries: list[Any], parts: dict[int, int]) -> None:
    for d in deliveries:
        meta = await d
        parts[meta.partition] = parts.get(meta.partition, 0) + 1
    deliveries.clear()


def register(cli: typer.Typer) -> None:
    cli.command("produce")(produce)
