"""streamkit's one Kafka I/O client: raw fetches (records + high watermark), topic admin.

Everything streamkit reads outside the group consumers goes through :class:`KafkaIO`:
the layout registry and the acks log, the progress log, worker heartbeats, the job
record, ``status``, ``topics`` and ``streamkit.testing``.  It is written for the
behaviours of the reference broker (see ``docs/architecture.md``):

- High watermarks come from *fetch* responses: the reference broker answers
  ListOffsets wrongly when the last batch holds several records.  A fetch far beyond
  the log end returns the high watermark without data there; on brokers that answer
  it with OFFSET_OUT_OF_RANGE (Apache Kafka), ListOffsets is right and is used.
- A short fetch answer is not the end: :meth:`KafkaIO.read` reads to a high watermark.
- Holes in an answer are asked for again before they are believed.
"""

from __future__ import annotations

from streamkit.kafkaio.admin import CREATE_CONFIGS, CREATE_PARTITIONS_API, KafkaAdmin
from streamkit.kafkaio.base import KafkaIOError
from streamkit.kafkaio.offsets import KafkaOffsets
from streamkit.kafkaio.reads import (
    ACKED_HOLE_WAIT,
    EMPTY_FETCH_SECONDS,
    EMPTY_FETCH_WAITS_MS,
    HOLE_CONFIRM_FETCHES,
    HOLE_CONFIRM_SECONDS,
    HOLE_PAUSES,
    LONG_READ_RECORDS,
    FetchedRecord,
    KafkaReads,
)

__all__ = [
    "ACKED_HOLE_WAIT",
    "CREATE_CONFIGS",
    "CREATE_PARTITIONS_API",
    "EMPTY_FETCH_SECONDS",
    "EMPTY_FETCH_WAITS_MS",
    "HOLE_CONFIRM_FETCHES",
    "HOLE_CONFIRM_SECONDS",
    "HOLE_PAUSES",
    "LONG_READ_RECORDS",
    "FetchedRecord",
    "KafkaIO",
    "KafkaIOError",
]


class KafkaIO(KafkaReads, KafkaOffsets, KafkaAdmin):
    """One low-level client for raw fetches, plus an admin client made on demand: the
    reads (``reads``), offsets (``offsets``) and topic admin (``admin``) of one connection
    (``base``)."""
