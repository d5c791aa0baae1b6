"""The headers of exactly-once output: which attempt of which writer a record belongs
to, and the markers that say an attempt was committed.

A *writer* is one processor of one app (``"app/3"``). Each time a processor's task is
opened for live processing it gets a new *incarnation*, a number that only grows over the
processor's life (the group generation it was opened in, then a counter). Between two
checkpoints it sends output under one *attempt* ``n`` of that incarnation (1, 2, ...):
every record carries ``streamkit.attempt`` = (incarnation, n, writer).

After a checkpoint has committed the processor's store (the decision), the processor
writes a *commit marker* into every partition of every topic it sent to in the attempt.
The first checkpoint of an incarnation also writes a *recovery marker* into every
partition of every output topic the app declares: "this writer goes on as incarnation I;
of the incarnations before, these attempts were committed: (I', n'), ..." (those whose
commit no marker may have said: a crash between a store commit and its markers, perhaps
several in a row), which aborts whatever else an earlier incarnation sent (a crash, or a
zombie). A marker is a record with no key and an empty value.

A reader that processes exactly once (``streamkit.exactly_once.reader``) applies a record
only once its attempt is known committed, drops it once known aborted, and holds what is
undecided (with everything after it in its partition, as Kafka's ``read_committed``
stops at the last stable offset).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ATTEMPT_HEADER",
    "COMMIT_HEADER",
    "RECOVER_HEADER",
    "Attempt",
    "Marker",
    "attempt_of",
    "commit_header",
    "is_marker",
    "marker_of",
    "recover_header",
]

ATTEMPT_HEADER = "streamkit.attempt"
COMMIT_HEADER = "streamkit.commit"
RECOVER_HEADER = "streamkit.recover"

_ATTEMPT = struct.Struct(">QQ")
_RECOVER = struct.Struct(">QH")


@dataclass(frozen=True, slots=True)
class Attempt:
    """The attempt an output record was sent in."""

    writer: str
    incarnation: int
    n: int

    def header(self) -> tuple[str, bytes]:
        return ATTEMPT_HEADER, _ATTEMPT.pack(self.incarnation, self.n) + self.writer.encode()


@dataclass(frozen=True, slots=True)
class Marker:
    """A commit marker (``recovered`` None: attempt ``n`` of ``incarnation`` is committed)
    or a recovery marker (the writer goes on as ``incarnation``; ``recovered``: per earlier
    incarnation, its last committed attempt, of those no commit marker may have told)."""

    writer: str
    incarnation: int
    n: int = 0
    recovered: dict[int, int] | None = None


def commit_header(attempt: Attempt) -> tuple[str, bytes]:
    return COMMIT_HEADER, _ATTEMPT.pack(attempt.incarnation, attempt.n) + attempt.writer.encode()


def recover_header(writer: str, incarnation: int, committed: Iterable[tuple[int, int]]) -> tuple[str, bytes]:
    pairs = list(committed)
    body = b"".join(_ATTEMPT.pack(inc, n) for inc, n in pairs)
    return RECOVER_HEADER, _RECOVER.pack(incarnation, len(pairs)) + body + writer.encode()


def attempt_of(record: Any) -> Attempt | None:
    """The attempt a record was sent in (None: no such header, or a malformed one: the
    record was not sent exactly once and is applied as it comes)."""
    for name, value in record.headers or ():
        if name == ATTEMPT_HEADER and value is not None and len(value) > _ATTEMPT.size:
            incarnation, n = _ATTEMPT.unpack_from(value)
            return Attempt(value[_ATTEMPT.size :].decode(errors="replace"), incarnation, n)
    return None


def is_marker(record: Any) -> bool:
    """A commit or recovery marker: no key, an empty value, a marker header. Every reader
    skips it (a handler never sees one); an exactly-once reader reads it first."""
    if record.key is not None or record.value:
        return False
    return any(name in (COMMIT_HEADER, RECOVER_HEADER) for name, _ in record.headers or ())


def marker_of(record: Any) -> Marker | None:
    """The marker a record is (None: it is not one, or a malformed one)."""
    if record.key is not None or record.value:
        return None
    for name, value in record.headers or ():
        if value is None:
            continue
        if name == COMMIT_HEADER and len(value) > _ATTEMPT.size:
            incarnation, n = _ATTEMPT.unpack_from(value)
            return Marker(value[_ATTEMPT.size :].decode(errors="replace"), incarnation, n)
        if name == RECOVER_HEADER and len(value) > _RECOVER.size:
            incarnation, count = _RECOVER.unpack_from(value)
            end = _RECOVER.size + count * _ATTEMPT.size
            if len(value) <= end:
                return None
            pairs = dict(_ATTEMPT.unpack_from(value, _RECOVER.size + i * _ATTEMPT.size) for i in range(count))
            return Marker(value[end:].decode(errors="replace"), incarnation, 0, pairs)
    return None
