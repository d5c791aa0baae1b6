"""Read an app's stores back as a Spark DataFrame: a Python data source ``streamkit``.

One Spark partition per store (processor); rows ``(processor, key, value)``::

    df = read_stores(spark, "myapp.module:app", "totals")              # bytes
    df = read_stores(spark, "myapp.module:app", "totals", decode=True) # text

    # or with the data source directly (after register(spark)):
    spark.read.format("streamkit").option("path", ".streamkit/orders").option("table", "totals").load()

Options: ``path`` (the app's directory ``<state_dir>/<app>`` holding ``processor-<i>``
stores, or one store directory), ``table``, ``app`` (``MODULE:APP``: gives the path and,
with ``decode=true``, the serdes), ``decode`` (keys via the table's key serde as text,
values as JSON text / the string), ``batch_rows``.

Stores are opened read-only (RocksDB's read-only mode, raw mode as the writer uses), so
reading works while processors run, and sees each store as of the moment it is opened.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamkit.spark._deps import require

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["NAME", "read_store_items", "read_stores", "register", "store_paths"]

NAME = "streamkit"

RAW_SCHEMA = "processor int, key binary, value binary"
DECODED_SCHEMA = "processor int, key string, value string"


def store_paths(path: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """``[(processor, store dir)]`` under an app directory (or the one store at ``path``)."""
    p = Path(path)
    if (p / "CURRENT").exists():
        name = p.name
        proc = int(name.split("-", 1)[1]) if name.startswith("processor-") and name[10:].isdigit() else 0
        return [(proc, str(p))]
    from streamkit.spark.staging import live_store_dirs

    return [(proc, str(d)) for proc, d in live_store_dirs(p).items() if (d / "CURRENT").exists()]


def read_store_items(path: str, table: str, batch_rows: int = 65536) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """``(keys, values)`` chunks of one table of one store, in key order, opened read-only."""
    from rocksdict import AccessType, Rdict

    from stores.rocksdb import CF_PREFIX, store_options

    opts = store_options()
    opts.create_if_missing(False)
    cf_names = Rdict.list_cf(path, opts)
    cf = CF_PREFIX + table
    if cf not in cf_names:
        tables = sorted(n[len(CF_PREFIX) :] for n in cf_names if n.startswith(CF_PREFIX))
        raise ValueError(f"store {path} has no table {table!r} (tables: {tables})")
    db = Rdict(path, opts, column_families={cf: opts}, access_type=AccessType.read_only())
    try:
        handle = db.get_column_family(cf)
        keys: list[Any] = []
        values: list[Any] = []
        for k, v in handle.items():
            keys.append(k)
            values.append(v)
            if len(keys) >= batch_rows:
                yield keys, values
                keys, values = [], []
        if keys:
            yield keys, values
        del handle
    finally:
        db.close()


def _datasource_classes() -> tuple[type, type]:
    ds = require("pyspark.sql.datasource")

    class StoreInputPartition(ds.InputPartition):  # type: ignore[name-defined]
        def __init__(self, processor: int, path: str) -> None:
            super().__init__((processor, path))
            self.processor = processor
            self.path = path

    class StoreReader(ds.DataSourceReader):  # type: ignore[name-defined]
        def __init__(self, options: dict[str, str]) -> None:
            self.options = options
            self.table = options["table"]
            self.decode = options.get("decode", "false").lower() == "true"
            self.batch_rows = int(options.get("batch_rows", "65536"))

        def partitions(self) -> list[Any]:
            found = store_paths(self.options["path"])
            return [StoreInputPartition(proc, path) for proc, path in found]

        def read(self, partition: Any) -> Iterator[Any]:
            import pyarrow as pa

            serdes = _serdes(self.options, self.table) if self.decode else None
            for keys, values in read_store_items(partition.path, self.table, self.batch_rows):
                proc = pa.array([partition.processor] * len(keys), pa.int32())
                if serdes is None:
                    k = pa.array(keys, pa.binary())
                    v = pa.array(values, pa.binary())
                else:
                    from streamkit.spark.encoding import decode_to_text

                    key_serde, value_serde = serdes
                    k = pa.array([_key_text(key_serde, x) for x in keys], pa.string())
                    v = pa.array(decode_to_text(value_serde, values), pa.string())
                yield pa.RecordBatch.from_arrays([proc, k, v], names=["processor", "key", "value"])

    class StoreDataSource(ds.DataSource):  # type: ignore[name-defined]
        """``spark.read.format("streamkit")``: the stores of an app (see module doc)."""

        @classmethod
        def name(cls) -> str:
            return NAME

        def schema(self) -> str:
            return DECODED_SCHEMA if self.options.get("decode", "false").lower() == "true" else RAW_SCHEMA

        def reader(self, schema: Any) -> Any:
            opts = dict(self.options)
            if "table" not in opts:
                raise ValueError("the streamkit data source needs option 'table'")
            if "path" not in opts:
                if "app" not in opts:
                    raise ValueError("the streamkit data source needs option 'path' or 'app'")
                app = _load(opts)
                state_dir = opts.get("state_dir") or str(app.settings.state_dir)
                opts["path"] = str(Path(state_dir).absolute() / app.name)
            return StoreReader(opts)

    return StoreDataSource, StoreReader


def _load(options: dict[str, str]) -> Any:
    import sys

    for p in reversed(options.get("sys_path", "").split(os.pathsep)):
        if p and p not in sys.path and os.path.isdir(p):
            sys.path.insert(0, p)
    from streamkit.loader import load_app

    return load_app(options["app"])


def _serdes(options: dict[str, str], table: str) -> tuple[Any, Any]:
    if "app" not in options:
        from stores.serde import RawSerde

        return RawSerde(), RawSerde()
    app = _load(options)
    t = app.tables[table]
    return t.store_key_serde, t.value_serde


def _key_text(serde: Any, data: bytes) -> str:
    from stores.serde import RawSerde

    obj = serde.loads(data)
    if isinstance(serde, RawSerde) or isinstance(obj, bytes):
        return bytes(obj).hex()
    if isinstance(obj, str):
        return obj
    import orjson

    return orjson.dumps(obj, default=str).decode()


_REGISTERED: set[int] = set()


def register(spark: SparkSession) -> None:
    """Register the ``streamkit`` data source with ``spark`` (idempotent)."""
    if id(spark) in _REGISTERED:
        return
    source, _ = _datasource_classes()
    spark.dataSource.register(source)
    _REGISTERED.add(id(spark))


def read_stores(
    spark: SparkSession,
    app: Any = None,
    table: str | None = None,
    *,
    path: str | os.PathLike[str] | None = None,
    decode: bool = False,
    state_dir: str | os.PathLike[str] | None = None,
) -> DataFrame:
    """The stores of ``app`` (an App, ``MODULE:APP``, or None with ``path``) as a DataFrame
    of ``(processor, key, value)``, one Spark partition per store."""
    from streamkit.app import App
    from streamkit.spark.workerpath import app_ref, worker_pythonpath

    if table is None:
        raise ValueError("read_stores needs the table name")
    register(spark)
    reader = spark.read.format(NAME).option("table", table).option("decode", str(decode).lower())
    ref: str | None = None
    if isinstance(app, App):
        ref = app_ref(app)
        if path is None:
            path = Path(state_dir or app.settings.state_dir).absolute() / app.name
        if decode and ref is None:
            raise ValueError("decode=True needs the app importable as MODULE:APP (pass the string)")
    elif isinstance(app, str):
        ref = app
    if ref is not None:
        reader = reader.option("app", ref).option("sys_path", worker_pythonpath())
    if state_dir is not None:
        reader = reader.option("state_dir", str(Path(state_dir).absolute()))
    if path is not None:
        reader = reader.option("path", str(Path(path).absolute()))
    elif ref is None:
        raise ValueError("read_stores needs an app or a path")
    return reader.load()
