"""`streamkit consume TOPIC`: print a topic's records, for a person (text) or a script (``--json``).

No consumer group: nothing is committed and no group's position moves. By default it
reads each partition from its start up to where it ended when the command started, then
exits (``kcat -C -e``); ``--follow`` keeps waiting for more. Reads go through
:class:`streamkit.kafkaio.KafkaIO`, as every read outside the group consumers does: the
reference broker answers ListOffsets wrongly and leaves batches out of some answers.

What streamkit itself puts in topics is said, never dropped silently: a dead letter shows
its reason, error and origin (the ``streamkit.error.*`` / ``streamkit.source.*`` headers
``streamkit.runtime.output`` writes); a copy for compaction (``sk.copy``, KIP-253's rule)
is skipped and counted, or shown labelled with ``--show-copies``; forwarded strays,
changelog markers and layout control records are labelled. The epoch stamp header
(``sk``) is left out of the text (``--json`` has every header).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import typer

POLL_SECONDS = 0.2
"""Pause of ``--follow`` after a round of fetches that found nothing (the reference broker
answers an empty fetch at once instead of waiting for records)."""
GROW_CHECK_SECONDS = 10.0
"""How often ``--follow`` looks for partitions added to the topic (CreatePartitions)."""
CHUNK_BYTES = 256 * 1024
"""Bytes asked for per partition and fetch (every partition is fetched at once)."""

REASON, ERROR, HANDLER = "streamkit.error.reason", "streamkit.error.exception", "streamkit.error.handler"
SOURCE = ("streamkit.source.topic", "streamkit.source.partition", "streamkit.source.offset")
DEAD_LETTER_HEADERS = frozenset((REASON, ERROR, HANDLER, *SOURCE))
"""The headers ``streamkit.runtime.output.Output.dead_letter`` writes: shown as the dead letter's block."""


def consume(
    topic: str = typer.Argument(..., help="the topic to read"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep waiting for new records (until Ctrl-C or --max)"),
    from_end: bool = typer.Option(False, "--from-end", help="with --follow: only records written from now on"),
    limit: int | None = typer.Option(None, "--max", "-n", min=1, help="stop after this many records"),
    partition: list[int] = typer.Option(None, "--partition", "-p", help="only this partition (repeatable)"),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="one JSON object per line: topic, partition, offset, timestamp (ms), key, value, value_format "
        "(json, text, base64, or null: no value), headers (a list of name and value pairs); keys and header "
        'values are text, null or {"base64": ...}; dead letters add dead_letter, streamkit\'s own records streamkit',
    ),
    show_copies: bool = typer.Option(
        False, "--show-copies", help="show streamkit's copies for compaction (labelled) instead of counting them"
    ),
    broker: str | None = typer.Option(
        None, "--broker", "-b", envvar="STREAMKIT_BROKER", help="bootstrap address (else STREAMKIT_BROKER)"
    ),
) -> None:
    """Print a topic's records, dead letters with their reason and error; to its end, or --follow.

    Each record: partition, offset, time (UTC), key, value, headers. Reads to where each partition ends now, then exits.

    No consumer group: nothing is committed, no group's position moves."""
    from streamkit.cli import CliError
    from streamkit.cli.topics import _broker

    connection = _broker(broker)
    if from_end and not follow:
        raise CliError("--from-end needs --follow (from the end, there is nothing to print until records come)")
    printer = Printer(topic, as_json=as_json, show_copies=show_copies, limit=limit)
    try:
        if asyncio.run(_consume(connection, topic, sorted(set(partition or ())), follow, from_end, printer)):
            raise KeyboardInterrupt  # (--follow stopped by Ctrl-C)
        printer.summary()
    except KeyboardInterrupt:
        printer.summary(interrupted=True)
        raise typer.Exit(130) from None
    except BrokenPipeError:  # `| head`: the reader has gone, which is no error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


async def _consume(
    connection: Any, topic: str, partitions: Sequence[int], follow: bool, from_end: bool, printer: Printer
) -> bool:
    """Print the records; whether Ctrl-C stopped ``--follow``."""
    from streamkit.cli import CliError
    from streamkit.kafkaio import KafkaIO

    async with KafkaIO(connection, client_id="streamkit-consume") as io:
        count = await io.partition_count(topic)
        if count is None:
            raise CliError(f"topic {topic} does not exist (streamkit topics list shows the topics)")
        if wrong := [p for p in partitions if not 0 <= p < count]:
            raise CliError(f"topic {topic} has partitions 0 to {count - 1}: no partition {wrong[0]}")
        parts = list(partitions) or list(range(count))
        ends = await io.high_watermarks(topic, parts)
        pos = dict(ends) if from_end else await io.log_start_offsets(topic, parts)
        if not follow:
            await _read_to(io, topic, pos, ends, printer)
            return False
        where = "from the end" if from_end else "from the start"
        stop = asyncio.Event()  # Ctrl-C: the loop ends after its round (no cancellation a library may swallow)
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
        typer.echo(f"following {topic} (partitions {_ranges(parts)}) {where}; Ctrl-C to stop", err=True)
        await _follow(io, topic, pos, printer, count if not partitions else None, stop)
        return stop.is_set()


async def _read_to(io: Any, topic: str, pos: dict[int, int], ends: dict[int, int], printer: Printer) -> None:
    """Every record below ``ends``, a response's worth of each partition in turn."""
    while live := [p for p in pos if pos[p] < ends[p]]:
        got = await asyncio.gather(*(io.fetch_at(topic, p, pos[p], ends[p], max_bytes=CHUNK_BYTES) for p in live))
        for p, (records, _hw) in zip(live, got):
            for rec in records:
                if rec.offset < ends[p] and printer.take(rec):
                    return
            if records:
                pos[p] = records[-1].offset + 1


async def _follow(
    io: Any, topic: str, pos: dict[int, int], printer: Printer, count: int | None, stop: asyncio.Event
) -> None:
    """Fetch every partition again and again until ``stop``; ``count``: the partitions seen
    (None: fixed set)."""
    grow_check = time.monotonic() + GROW_CHECK_SECONDS
    while not stop.is_set():
        parts = list(pos)
        got = await asyncio.gather(*(io.fetch(topic, p, pos[p], max_bytes=CHUNK_BYTES) for p in parts))
        fresh = False
        for p, (records, _hw) in zip(parts, got):
            for rec in records:
                if printer.take(rec):
                    return
            if records:
                pos[p], fresh = records[-1].offset + 1, True
        printer.flush()
        if count is not None and time.monotonic() >= grow_check:
            grow_check = time.monotonic() + GROW_CHECK_SECONDS
            now = await io.partition_count(topic) or count
            if now > count:
                typer.echo(f"{topic} grew to {now} partitions: following {_ranges(range(count, now))} too", err=True)
                pos.update(dict.fromkeys(range(count, now), 0))
                count = now
        if not fresh:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_SECONDS):
                    await stop.wait()


def _ranges(parts: Sequence[int]) -> str:
    return f"{parts[0]}-{parts[-1]}" if len(parts) > 2 and parts[-1] - parts[0] == len(parts) - 1 else str(list(parts))


# ---------------------------------------------------------------------------- showing records


def _text(data: bytes) -> str | None:
    """``data`` as text: UTF-8 without control characters but tab and line ends; else None."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return None
    return None if any((c < " " and c not in "\t\n\r") or c == "\x7f" for c in text) else text


def _escape(text: str) -> str:
    """One line: line ends, tabs and other unprintable characters escaped."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _bytes_json(data: bytes | None) -> Any:
    """A key or header value in ``--json``: text, null, or ``{"base64": ...}``."""
    if data is None:
        return None
    text = _text(data)
    return text if text is not None else {"base64": base64.b64encode(data).decode()}


def _bytes_text(data: bytes | None) -> str:
    if data is None:
        return "(none)"
    text = _text(data)
    return _escape(text) if text is not None else _binary(data)


def _binary(data: bytes) -> str:
    return f"(binary, {len(data)} bytes, base64) {base64.b64encode(data).decode()}"


def value_view(data: bytes | None) -> tuple[str | None, Any]:
    """``(format, value)`` of a record value: ("json", the parsed value), ("text", str),
    ("base64", str), or (None, None) for a record without a value (a tombstone)."""
    import orjson

    if data is None:
        return None, None
    try:
        return "json", orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    text = _text(data)
    return ("text", text) if text is not None else ("base64", base64.b64encode(data).decode())


def _iso(ts: int) -> str:
    if ts < 0:
        return "(no timestamp)"
    return datetime.fromtimestamp(ts / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def streamkit_kind(topic: str, rec: Any) -> tuple[str, str] | None:
    """``(kind, what it is)`` for a record streamkit writes for itself, else None."""
    from streamkit.layout.registry import ACKS_TOPIC
    from streamkit.layout.stamps import COPY_HEADER, is_copy
    from streamkit.layout.strays import STRAY_HEADER, parse_origin
    from streamkit.state.changelog import MARKER_PREFIXES

    headers = dict(rec.headers)
    if is_copy(rec.headers):
        of = headers[COPY_HEADER].split(b":")[0].decode(errors="replace")  # (then its seal)
        return "compaction-copy", f"COPY for compaction of the record placed in partition {of}: consumers skip it"
    if STRAY_HEADER in headers and (origin := parse_origin(headers[STRAY_HEADER])) is not None:
        return "forwarded-stray", (
            f"FORWARDED STRAY: the record at partition {origin[0]} offset {origin[1]}, placed again where the "
            "layout puts its key"
        )
    if rec.key is not None and rec.key.startswith(MARKER_PREFIXES):
        return "changelog-marker", "CHANGELOG MARKER: where a store's checkpoint ends in its changelog"
    if topic == ACKS_TOPIC:
        kind, value = value_view(rec.value)
        what = value.get("type", "?") if kind == "json" and isinstance(value, dict) else "?"
        return "layout-control", f"LAYOUT CONTROL RECORD ({what})"
    return None


def dead_letter(headers: dict[str, bytes]) -> dict[str, Any] | None:
    """Why and whence, for a record with the dead-letter headers; else None."""
    if REASON not in headers:
        return None

    def text(name: str) -> str | None:
        return headers[name].decode(errors="replace") if name in headers else None

    def number(name: str) -> int | str | None:
        found = text(name)
        return int(found) if found is not None and found.lstrip("-").isdigit() else found

    topic, partition, offset = SOURCE
    return {
        "reason": text(REASON),
        "error": text(ERROR),
        "handler": text(HANDLER),
        "source": {"topic": text(topic), "partition": number(partition), "offset": number(offset)},
    }


class Printer:
    """Shows records (text or JSON lines on standard output) and counts them for the summary."""

    def __init__(self, topic: str, *, as_json: bool, show_copies: bool, limit: int | None) -> None:
        from streamkit.layout.stamps import COPY_HEADER, EPOCH_HEADER, PRODUCER_HEADER, STAMP_HEADER
        from streamkit.layout.strays import STRAY_HEADER

        self.topic = topic
        self.as_json = as_json
        self.show_copies = show_copies
        self.limit = limit
        self.shown: Counter[int] = Counter()
        self.reasons: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()
        self.copies_skipped = 0
        self._unshown = frozenset((STAMP_HEADER, EPOCH_HEADER, PRODUCER_HEADER, COPY_HEADER, STRAY_HEADER))
        """Headers left out of the text: the stamps, and those a label or the dead letter's block says."""

    def take(self, rec: Any) -> bool:
        """Show ``rec`` (or count it as a skipped copy); True once ``--max`` records were shown."""
        kind = streamkit_kind(self.topic, rec)
        if kind is not None and kind[0] == "compaction-copy" and not self.show_copies:
            self.copies_skipped += 1
            return False
        headers = dict(rec.headers)
        dead = dead_letter(headers)
        if dead is not None:
            self.reasons[dead["reason"] or "?"] += 1
        if kind is not None:
            self.kinds[kind[0]] += 1
        sys.stdout.write(self._json(rec, kind, dead) if self.as_json else self._text(rec, kind, dead))
        self.shown[rec.partition] += 1
        return self.limit is not None and self.shown.total() >= self.limit

    def _json(self, rec: Any, kind: tuple[str, str] | None, dead: dict[str, Any] | None) -> str:
        import orjson

        fmt, value = value_view(rec.value)
        out: dict[str, Any] = {
            "topic": rec.topic,
            "partition": rec.partition,
            "offset": rec.offset,
            "timestamp": rec.timestamp if rec.timestamp >= 0 else None,
            "key": _bytes_json(rec.key),
            "value": value,
            "value_format": fmt,
            "headers": [[name, _bytes_json(data)] for name, data in rec.headers],
        }
        if dead is not None:
            out["dead_letter"] = dead
        if kind is not None:
            out["streamkit"] = kind[0]
        return orjson.dumps(out).decode() + "\n"

    def _text(self, rec: Any, kind: tuple[str, str] | None, dead: dict[str, Any] | None) -> str:
        import orjson

        lines = [f"partition {rec.partition}  offset {rec.offset}  {_iso(rec.timestamp)}  key: {_bytes_text(rec.key)}"]
        if kind is not None:
            lines.append(f"  {kind[1]}")
        if dead is not None:
            src = dead["source"]
            handler = f" (handler {dead['handler']})" if dead["handler"] else ""
            lines.append(f"  DEAD LETTER  reason: {dead['reason']}")
            lines.append(f"  error: {_escape(dead['error'] or '(none given)')}")
            lines.append(f"  from: {src['topic']} partition {src['partition']} offset {src['offset']}{handler}")
        fmt, value = value_view(rec.value)
        if fmt == "json":
            shown = orjson.dumps(value).decode()
        elif fmt == "text":
            shown = f"(text) {_escape(value)}" if value else "(empty)"
        elif fmt == "base64":
            shown = _binary(rec.value)
        else:
            shown = "none (no value: a tombstone)"
        lines.append(f"  value: {shown}")
        rest = [(n, d) for n, d in rec.headers if n not in self._unshown and n not in DEAD_LETTER_HEADERS]
        if rest:
            lines.append("  headers: " + ", ".join(f"{n}={_bytes_text(d)}" for n, d in rest))
        return "\n".join(lines) + "\n"

    def flush(self) -> None:
        sys.stdout.flush()

    def summary(self, *, interrupted: bool = False) -> None:
        """One line on standard error: what was shown, dead letters by reason, what was skipped."""
        self.flush()
        total = self.shown.total()
        parts = ", ".join(f"{p}: {n}" for p, n in sorted(self.shown.items()))
        line = f"{self.topic}: {total} record{'s' if total != 1 else ''}"
        line += f" (by partition {parts})" if parts else ""
        if self.reasons:
            reasons = ", ".join(f"{r} {n}" for r, n in self.reasons.most_common())
            line += f"; dead letters by reason: {reasons}"
        if self.copies_skipped:
            line += f"; {self.copies_skipped} streamkit copies for compaction skipped (--show-copies shows them)"
        if self.limit is not None and total >= self.limit:
            line += f"; stopped at --max {self.limit}"
        elif interrupted:
            line += "; interrupted"
        typer.echo(line, err=True)


def register(cli: typer.Typer) -> None:
    cli.command("consume")(consume)
