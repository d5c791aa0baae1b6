"""Where a backfill's history comes from: ``FORMAT:PATH``, ``table:NAME`` or a plain path,
loaded as a Spark DataFrame, and (for Parquet) its columns read without Spark, so that a
wrong column name is refused before the JVM starts.

Importable without pyspark.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamkit.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["FORMATS", "column_errors", "load_source", "parquet_columns", "parse_source"]

FORMATS = ("parquet", "json", "csv", "orc", "text", "avro", "delta", "table")
_EXT = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
    ".csv": "csv",
    ".orc": "orc",
    ".avro": "avro",
}


def parse_source(source: str) -> tuple[str, str]:
    """``FORMAT:PATH`` or a path -> (format, path or table name)."""
    fmt, sep, rest = source.partition(":")
    if sep and fmt.lower() in FORMATS and rest:
        return fmt.lower(), rest
    path = Path(source)
    ext = path.suffix.lower()
    if ext in _EXT:
        return _EXT[ext], source
    if path.is_dir():
        if (path / "_delta_log").is_dir():
            return "delta", source
        for f in sorted(path.rglob("*")):
            if f.suffix.lower() in _EXT:
                return _EXT[f.suffix.lower()], source
    return "parquet", source


def check_exists(source: str) -> None:
    fmt, where = parse_source(source)
    if fmt not in ("delta", "table") and "://" not in where and not Path(where).exists():
        raise ConfigError(f"history {source}: no such file or directory")


def load_source(spark: SparkSession, source: str, options: Mapping[str, str] | None = None) -> DataFrame:
    fmt, where = parse_source(source)
    check_exists(source)
    if fmt == "table":
        return spark.table(where)
    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    for k, v in (options or {}).items():
        reader = reader.option(k, v)
    return reader.load(where)


def parquet_columns(source: str) -> list[str] | None:
    """The column names of a local Parquet file or directory (the footer only), or None
    where they cannot be known without Spark (other formats, remote paths)."""
    fmt, where = parse_source(source)
    if fmt != "parquet" or "://" in where or not Path(where).exists():
        return None
    import pyarrow.dataset as ds

    try:
        return list(ds.dataset(where, format="parquet").schema.names)
    except Exception as exc:  # noqa: BLE001 - not Parquet after all: say so in one line
        raise ConfigError(f"history {source}: cannot read it as Parquet: {exc}") from None


def column_errors(have: Iterable[str], wanted: Mapping[str, Iterable[str]], where: str) -> list[str]:
    """``wanted``: what asks for a column (a parameter) -> the column names it names."""
    columns = list(have)
    out: list[str] = []
    for what, names in wanted.items():
        for name in names:
            if name in columns:
                continue
            close = difflib.get_close_matches(name, columns, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            out.append(f"{what}: no column {name!r} in {where}{hint}; its columns are {', '.join(columns)}")
    return out


def wanted_columns(**by_param: str | Iterable[str] | None) -> dict[str, list[str]]:
    """``key_col="k", value_col="a,b", order_by=None`` -> {"key_col": ["k"], "value_col": ["a", "b"]}."""
    out: dict[str, list[str]] = {}
    for param, value in by_param.items():
        if value is None:
            continue
        names = [c.strip() for c in value.split(",")] if isinstance(value, str) else [str(c) for c in value]
        names = [c for c in names if c]
        if names:
            out[param] = names
    return out


def history_columns(source: Any) -> list[str] | None:
    """Columns of a history given as a source string (Parquet) or a DataFrame."""
    if isinstance(source, str):
        return parquet_columns(source)
    return list(source.columns)
