"""The rows one processor wrote to sinks since its last checkpoint, and how they are
committed with it (the transactional outbox pattern).

The rows go into the processor's checkpoint (``SINK_OUTBOX``: the store's atomic batch,
its changelog), numbered with the writer's next checkpoint number. Only once that
checkpoint is in the store are they written to their sinks (``flush``), each sink in one
transaction with the number it reached per writer. A crash before the store commit loses
the rows with the state that made them (the input is applied again); a crash after it,
before or during the sinks' write, leaves them in the checkpoint, and the processor's
next incarnation writes them again: a sink that holds that number skips them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from streamkit.errors import StreamkitError
from streamkit.sinks.base import Owner, Sink, SinkBatch

__all__ = ["ROW_BYTES_PER_CHECKPOINT", "SINK_OUTBOX", "SinkOutbox", "checkpoint_due", "claim_sinks"]

ROW_BYTES_PER_CHECKPOINT = 512 * 1024
"""Serialised sink rows the processors of one group member hold before their next
checkpoint is taken, whatever ``sink_rows_per_checkpoint`` says: a checkpoint keeps its
rows in its changelog marker, one Kafka record (1 MB at most by default), beside the
checkpoint itself and any rows not yet known written."""

SINK_OUTBOX = "sink_outbox"
"""Checkpoint extra: {"seq": the writer's last checkpoint number, "pending": [{"sink",
"writer", "seq", "rows"}, ...] not known written}."""


class SinkOutbox:
    """One hosted processor's sink rows (see the module docstring)."""

    def __init__(
        self,
        writer: str,
        extra: Mapping[str, Any],
        floor: int = 0,
        keys: Mapping[str, tuple[str, ...]] | None = None,
        owner: Owner | None = None,
        keeping: frozenset[str] = frozenset(),
    ) -> None:
        """``floor``: the highest number a sink holds for the writer (a store that lost its
        count, rebuilt from the input or seeded from another processor's, goes on beyond
        it: a sink would skip a number it holds). ``owner``: the hosting worker, which its
        batches name (``SinkBatch.owner``)."""
        self.writer = writer
        self.owner = owner
        kept = extra.get(SINK_OUTBOX) or {}
        self.seq = max(int(kept.get("seq", 0)) if kept.get("writer", writer) == writer else 0, floor)
        self.pending: list[dict[str, Any]] = list(kept.get("pending", ()))
        """Batches of committed checkpoints not known written (those of another writer
        too: a store seeded from another processor's carries its)."""
        self.keys = dict(keys or {})
        """Per upsert sink, its key columns: a key's last row of a checkpoint is the one kept."""
        self.keeping = keeping
        """The upsert sinks that keep a column a row leaves out (``Sink.keeps_left_out``):
        a key's last row takes it from the key's earlier rows."""
        self.rows: dict[str, dict[Any, dict[str, Any]]] = {}
        """Per sink, its rows since the last checkpoint, in order (keyed by the row's key
        for an upsert sink, else by their number)."""
        self.written = 0
        """Rows the sinks took (not those they held already)."""
        self.size = 0
        """The serialised size of the rows since the last checkpoint (an upsert sink's
        replaced rows too: at most a checkpoint comes sooner)."""

    def add(self, sink: str, row: dict[str, Any]) -> None:
        """A row for ``sink``; refused (one line naming the sink) when it is not JSON, or
        larger than a checkpoint can hold."""
        try:
            size = len(orjson.dumps(row))
        except TypeError as exc:
            raise StreamkitError(f"sink {sink!r}: a row must be a dict of JSON values ({exc})") from None
        if size > ROW_BYTES_PER_CHECKPOINT:
            raise StreamkitError(
                f"sink {sink!r}: a row of {size:,} bytes is more than a checkpoint holds "
                f"({ROW_BYTES_PER_CHECKPOINT:,} bytes of rows)"
            )
        self.size += size
        rows = self.rows.setdefault(sink, {})
        if columns := self.keys.get(sink):
            key = tuple(row[c] for c in columns)
            earlier = rows.pop(key, None)  # the last row of a key, in the place of its last write
            rows[key] = {**earlier, **row} if earlier is not None and sink in self.keeping else row
        else:
            rows[len(rows)] = row

    def count(self) -> int:
        return sum(len(rows) for rows in self.rows.values())

    def _entries(self, seq: int) -> list[dict[str, Any]]:
        return [
            {"sink": s, "writer": self.writer, "seq": seq, "rows": list(rows.values())}
            for s, rows in sorted(self.rows.items())
        ]

    def to_extra(self) -> dict[str, Any] | None:
        """What the checkpoint being written records (None: nothing)."""
        seq = self.seq + 1 if self.rows else self.seq
        pending = self.pending + self._entries(seq)
        if not pending and not seq:
            return None
        return {"writer": self.writer, "seq": seq, "pending": pending}

    def committed(self) -> None:
        """The checkpoint recording :meth:`to_extra` is in the store."""
        if self.rows:
            self.seq += 1
            self.pending += self._entries(self.seq)
            self.rows = {}
            self.size = 0

    async def flush(self, sinks: Mapping[str, Sink]) -> None:
        """Write the pending batches, each sink in one transaction (in a thread)."""
        if not self.pending:
            return
        by_sink: dict[str, list[SinkBatch]] = {}
        for entry in self.pending:
            batch = SinkBatch(entry["writer"], int(entry["seq"]), entry["rows"], self.owner)
            by_sink.setdefault(entry["sink"], []).append(batch)
        for name, batches in sorted(by_sink.items()):
            sink = sinks.get(name)
            if sink is None:
                raise KeyError(f"the checkpoint holds rows for sink {name!r}, which the app no longer declares")
            self.written += await asyncio.to_thread(sink.write, batches)
        self.pending = []


def checkpoint_due(outboxes: Iterable[SinkOutbox], rows: int) -> bool:
    """Whether ``outboxes`` (one group member's) hold ``rows`` rows or more, or
    :data:`ROW_BYTES_PER_CHECKPOINT` bytes of them."""
    held = list(outboxes)
    return sum(o.count() for o in held) >= rows or sum(o.size for o in held) >= ROW_BYTES_PER_CHECKPOINT


def claim_sinks(sinks: Mapping[str, Sink], writer: str, owner: Owner) -> int:
    """``writer`` claimed in every sink by ``owner`` (``Sink.claim``); the highest number
    any of them holds for it."""
    return max((sink.claim(writer, owner) for sink in sinks.values()), default=0)
