"""`streamkit produce TOPIC [FILE]`: send JSON lines through streamkit's producer, so that
each record lands where the topic's layout places its key (a plain Kafka producer's
default partitioner knows nothing of layouts: it spreads keys over reserved partitions
too, and over the wrong ones after an expansion)."""

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


def parse_line(line: str, key_field: str | None, separator: str | None) -> tuple[str | None, Any]:
    """One input line -> (key, value). ``separator``: ``KEY<sep>JSON``; ``key_field``: the
    key is that field of the JSON object (as text); neither: no key."""
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
        if not isinstance(value, dict) or value.get(key_field) is None:
            raise ValueError(f"no field {key_field!r} to take the key from")
        key = str(value[key_field])
    return key, value


def produce(
    topic: str = typer.Argument(..., help="the topic to write to"),
    file: Path | None = typer.Argument(None, help="JSON lines (default: standard input)"),
    key_field: str | None = typer.Option(None, "--key-field", "-k", help="take each record's key from this field"),
    separator: str | None = typer.Option(None, "--key-separator", help="lines are KEY<SEP>JSON"),
    broker: str | None = typer.Option(
        None, "--broker", "-b", envvar="STREAMKIT_BROKER", help="bootstrap address (else STREAMKIT_BROKER)"
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Send JSON lines to TOPIC through the layout-aware producer, with a progress bar."""
    from streamkit.cli import CliError
    from streamkit.cli.topics import _broker

    connection = _broker(broker)
    if key_field is not None and separator is not None:
        raise CliError("give --key-field or --key-separator, not both")
    where = str(file) if file is not None else "<stdin>"
    if file is not None and not file.is_file():
        raise CliError(f"{where}: no such file")
    total = sum(1 for _ in _lines(file.open())) if file is not None else None
    source = file.open() if file is not None else sys.stdin
    try:
        sent, parts = asyncio.run(_send(connection, topic, source, where, key_field, separator, total, progress))
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
    key_field: str | None,
    separator: str | None,
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
                    key, value = parse_line(line, key_field, separator)
                except ValueError as exc:
                    await producer.flush()
                    raise CliError(f"{where}:{number}: {exc}; the {sent:,} records before it were sent") from None
                deliveries.append(await producer.send(topic, key, value))
                sent += 1
                if sent % 10_000 == 0:  # count what was acknowledged so far: memory stays bounded
                    await _count(deliveries, parts)
                    bar.update(task, completed=sent)
            await producer.flush()
            await _count(deliveries, parts)
            bar.update(task, completed=sent)
    return sent, parts


async def _count(deliveries: list[Any], parts: dict[int, int]) -> None:
    for d in deliveries:
        meta = await d
        parts[meta.partition] = parts.get(meta.partition, 0) + 1
    deliveries.clear()


def register(cli: typer.Typer) -> None:
    cli.command("produce")(produce)
