"""What the driver and the Spark tasks share: the task :class:`Spec` (pickled to the
workers), the table codecs, the metadata rows the tasks return, and the error markers
that let the driver turn a task failure back into a one-line error.

Importable without pyspark (see :mod:`.tasks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from stores.serde import Serde

# Markers that let the driver turn a task failure back into a one-line error.
ERROR_MARK = "STREAMKIT-BACKFILL-ERROR<<"
ERROR_END = ">>"

META_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("bucket", pa.int32()),
        ("proc", pa.int32()),
        ("table", pa.string()),
        ("path", pa.string()),
        ("rows", pa.int64()),
        ("keys", pa.int64()),
        ("topic", pa.string()),
        ("part", pa.int32()),
        ("max_off", pa.int64()),
        ("info", pa.string()),
        ("seconds", pa.float64()),
    ]
)
META_DDL = (
    "kind string, bucket int, proc int, table string, path string, rows long, keys long, "
    "topic string, part int, max_off long, info string, seconds double"
)


class TaskError(Exception):
    """An error inside a task whose message the driver shows as is."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(f"{ERROR_MARK}{kind}|{message}{ERROR_END}")


@dataclass(frozen=True)
class TableCodec:
    name: str
    key_serde: Serde
    value_serde: Serde
    key_encoded: bool = False  # the key column already holds the stored bytes
    value_encoded: bool = False


@dataclass(frozen=True)
class Spec:
    """What the tasks of one backfill need (pickled to the workers)."""

    mode: str  # "state" | "replay"
    p0: int
    p: int
    subs: int
    sst_root: str
    large_binary: bool = True  # Spark's Arrow binary type (spark.sql.execution.arrow.useLargeVarTypes)
    # stage A inputs
    key_col: str = "key"
    value_col: str = "value"
    topic: str | None = None  # the input topic (mode 2), or the default topic of positions
    topic_col: str | None = None
    partition_col: str | None = None
    offset_col: str | None = None
    timestamp_col: str | None = None
    order_cols: tuple[str, ...] = ()
    tables: tuple[TableCodec, ...] = ()  # mode 1: the tables (by index); mode 2: tables to write
    # mode 2
    app_ref: str | None = None
    app_pickle: bytes | None = None
    sys_path: tuple[str, ...] = ()
    key_serde: Serde | None = None  # the topic's serdes (mode 2)
    value_serde: Serde | None = None
    # mode 2 over several topics (``topic_col``): each topic's (name, key serde, value serde)
    topic_serdes: tuple[tuple[str, Serde, Serde], ...] = ()
    # tests
    fail_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _meta(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    cols = {name: [r.get(name) for r in rows] for name in META_SCHEMA.names}
    return pa.RecordBatch.from_pydict(cols, schema=META_SCHEMA)
