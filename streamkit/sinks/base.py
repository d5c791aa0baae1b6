"""What a sink is: a destination that writes batches of rows and, in the same
transaction, how far each writer got, so that it can tell a batch it already holds."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streamkit.errors import StreamkitError

__all__ = ["Owner", "Sink", "SinkBatch", "SinkFencedError", "last_per_key"]


@dataclass(frozen=True)
class SinkBatch:
    """The rows one processor wrote to one sink between two of its checkpoints."""

    writer: str
    """The processor ("app/3")."""
    seq: int
    """The writer's checkpoint number for its rows: it only grows over the writer's life
    (it is in the processor's checkpoint), and only a committed checkpoint's batch is
    ever written, so a number the sink holds always stands for the same rows."""
    rows: list[dict[str, Any]]
    owner: Owner | None = None
    """The worker writing it (None: not said): a sink that fences (:meth:`Sink.claim`)
    refuses it when a newer owner of the writer claimed it since."""


@dataclass(frozen=True)
class Owner:
    """Who hosts a writer's processor: the job's incarnation and the group generation the
    worker took it in. Generations are compared within an incarnation only (a job reset
    starts them again)."""

    incarnation: str
    generation: int

    def behind(self, claimed: Owner | None) -> bool:
        """Whether ``claimed`` took the writer over from this owner (a zombie's batch)."""
        return claimed is not None and claimed.incarnation == self.incarnation and self.generation < claimed.generation


class SinkFencedError(StreamkitError):
    """A batch refused because a newer owner of its writer claimed it: the worker writing
    it was paused through a rebalance (a zombie)."""


class Sink(ABC):
    """A destination for rows (``app.sink(name, sink)``; ``ctx.write(sink, row)``).

    ``write`` gets the batches of committed checkpoints, oldest first per writer, perhaps
    again after a crash: in one transaction it writes those whose ``seq`` is beyond what
    it holds for their writer, and records the new ``seq`` per writer; it returns the rows
    it wrote. It runs in a thread (it may block)."""

    name: str = ""
    """Set by ``app.sink``."""
    upsert_key: tuple[str, ...] = ()
    """The columns a row replaces the row of (empty: rows are appended): a processor keeps
    a key's last row of a checkpoint only."""
    keeps_left_out: bool = False
    """Whether an upsert leaves a column a row leaves out as it was (else: null). Either
    way a key's rows of one checkpoint, or of several written at once, end as they would
    written one after another: kept, a row takes the columns its earlier rows had and it
    lacks (``last_per_key``)."""

    def open(self) -> None:  # noqa: B027 - most sinks connect on their first write
        """Connect (and create what the sink needs); called once per worker, at start."""

    @abstractmethod
    def write(self, batches: Sequence[SinkBatch]) -> int: ...

    @abstractmethod
    def progress(self, writer: str) -> int:
        """The ``seq`` the sink holds for ``writer`` (0: none): a processor whose store
        lost its count (a rebuild from the input) goes on beyond it."""

    def check(self, row: dict[str, Any]) -> None:  # noqa: B027 - most sinks take any row
        """Refuse (``ValueError``, naming the sink) a row this sink could never write, when
        the handler writes it (``ctx.write``): its record is then a dead letter, rather than
        the row a checkpoint that fails at every try."""

    def claim(self, writer: str, owner: Owner) -> int:
        """``writer``'s processor is taken over by ``owner``, before it reads the
        processor's state: a sink that can refuses from now on every batch of an owner
        ``behind`` it (raising :class:`SinkFencedError`), so that a zombie's batch is either
        refused or already in that state. Returns :meth:`progress`. (This one does not
        fence.)"""
        return self.progress(writer)

    def close(self) -> None:  # noqa: B027 - nothing to let go of, for most
        """Disconnect; called once, at stop."""


def last_per_key(rows: Sequence[dict[str, Any]], keys: Sequence[str], *, keep: bool = False) -> list[dict[str, Any]]:
    """``rows`` with one row per key, its last; ``keep``: with the columns it leaves out
    taken from the key's earlier rows (``Sink.keeps_left_out``)."""
    last: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        k = tuple(row[c] for c in keys)
        earlier = last.pop(k, None)
        last[k] = {**earlier, **row} if keep and earlier is not None else row
    return list(last.values())
