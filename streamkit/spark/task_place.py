"""Stage A of the Spark tasks (``place_*``, narrow, before the shuffle): encode keys and
values with the serdes, hash the key bytes, compute processor and bucket (vectorised).

Importable without pyspark (see :mod:`.tasks`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stores.serde import RawSerde, Serde
from streamkit.spark.encoding import encode_array
from streamkit.spark.placement import buckets_of, hashes_of
from streamkit.spark.task_spec import Spec, TaskError

_RAW = RawSerde()


def _binary(arr: pa.Array, large: bool) -> pa.Array:
    want = pa.large_binary() if large else pa.binary()
    return arr if arr.type == want else arr.cast(want)


def _to_ms(arr: pa.Array) -> pa.Array:
    """A timestamp / integer column as int64 milliseconds."""
    t = arr.type
    if pa.types.is_timestamp(t):
        return arr.cast(pa.timestamp("ms", tz=t.tz)).cast(pa.int64())
    if pa.types.is_date(t):
        return arr.cast(pa.date64()).cast(pa.int64())
    return arr.cast(pa.int64())


def _col(batch: pa.RecordBatch, name: str | None) -> pa.Array | None:
    if name is None:
        return None
    return batch.column(name)


def _null_array(t: pa.DataType, n: int) -> pa.Array:
    return pa.nulls(n, type=t)


def _positions_cols(spec: Spec, batch: pa.RecordBatch) -> tuple[pa.Array, pa.Array, pa.Array]:
    n = batch.num_rows
    topic = _col(batch, spec.topic_col)
    if topic is None:
        topic = pa.array([spec.topic] * n, pa.string()) if spec.offset_col else _null_array(pa.string(), n)
    else:
        topic = topic.cast(pa.string())
    part = _col(batch, spec.partition_col)
    part = _null_array(pa.int32(), n) if part is None else part.cast(pa.int32())
    off = _col(batch, spec.offset_col)
    off = _null_array(pa.int64(), n) if off is None else off.cast(pa.int64())
    return topic, part, off


def place_state(spec: Spec, table_index: int, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Mode 1, stage A: (key, value[, topic, partition, offset]) -> (_b, _t, _k, _v, _topic, _part, _off)."""
    codec = spec.tables[table_index]
    for batch in batches:
        n = batch.num_rows
        if n == 0:
            continue
        kcol = batch.column(spec.key_col)
        vcol = batch.column(spec.value_col)
        what = f"table {codec.name!r}"
        try:
            if codec.key_encoded:
                k = encode_array(_RAW, kcol, what=f"{what}, column {spec.key_col!r}")
            else:
                k = encode_array(codec.key_serde, kcol, what=f"{what}, column {spec.key_col!r}")
            if codec.value_encoded:
                v = encode_array(_RAW, vcol, what=f"{what}, column {spec.value_col!r}", nulls="keep")
            else:
                v = encode_array(codec.value_serde, vcol, what=f"{what}, column {spec.value_col!r}", nulls="keep")
        except ValueError as exc:
            raise TaskError("encode", str(exc)) from None
        except TypeError as exc:
            raise TaskError("encode", str(exc)) from None
        h = hashes_of(k)
        _, b = buckets_of(h, spec.p0, spec.p, spec.subs)
        topic, part, off = _positions_cols(spec, batch)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(b, pa.int32()),
                pa.array(np.full(n, table_index, dtype=np.int32)),
                _binary(k, spec.large_binary),
                _binary(v, spec.large_binary),
                topic,
                part,
                off,
            ],
            names=["_b", "_t", "_k", "_v", "_topic", "_part", "_off"],
        )


def place_replay(spec: Spec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Mode 2, stage A: records -> (_b, _k, _v, _ts, _topic, _part, _off, order columns...).

    Over several topics (``spec.topic_serdes``), each row is encoded with its own topic's
    serdes; a row of a topic the app does not consume fails the run. Rows without a key
    were dropped and counted before (``keyless.counted``)."""
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if not spec.topic_serdes:
            assert spec.key_serde is not None and spec.value_serde is not None
            yield _place_records(spec, batch, spec.topic, spec.key_serde, spec.value_serde)
            continue
        assert spec.topic_col is not None
        names = batch.column(spec.topic_col).cast(pa.string())
        known = {name for name, _, _ in spec.topic_serdes}
        strays = set(pc.unique(names).to_pylist()) - known
        if strays:
            raise TaskError(
                "topics",
                f"the history has rows of topic(s) {sorted(strays, key=str)} (column {spec.topic_col!r}), which "
                f"the app does not consume (it consumes {sorted(known)})",
            )
        for name, key_serde, value_serde in spec.topic_serdes:
            rows = batch.filter(pc.equal(names, name))
            if rows.num_rows:
                yield _place_records(spec, rows, name, key_serde, value_serde)


def _place_records(spec: Spec, batch: pa.RecordBatch, topic_name: str | None, key_serde: Serde,
                   value_serde: Serde) -> pa.RecordBatch:  # fmt: skip
    """Encode and place one topic's keyed records."""
    if spec.extra.get("key_encoded"):
        key_serde = _RAW
    if spec.extra.get("value_encoded"):
        value_serde = _RAW
    n = batch.num_rows
    try:
        k = encode_array(key_serde, batch.column(spec.key_col), what=f"topic {topic_name!r}, column {spec.key_col!r}")
        v = encode_array(
            value_serde,
            batch.column(spec.value_col),
            what=f"topic {topic_name!r}, column {spec.value_col!r}",
            nulls="keep",
        )
    except (ValueError, TypeError) as exc:
        raise TaskError("encode", str(exc)) from None
    h = hashes_of(k)
    _, b = buckets_of(h, spec.p0, spec.p, spec.subs)
    ts = _col(batch, spec.timestamp_col)
    ts = pa.array(np.full(n, -1, dtype=np.int64)) if ts is None else _to_ms(ts)
    topic, part, off = _positions_cols(spec, batch)
    arrays = [
        pa.array(b, pa.int32()),
        _binary(k, spec.large_binary),
        _binary(v, spec.large_binary),
        ts,
        topic,
        part,
        off,
    ]
    names = ["_b", "_k", "_v", "_ts", "_topic", "_part", "_off"]
    for i, c in enumerate(spec.order_cols):
        arrays.append(batch.column(c))
        names.append(f"_o{i}")
    return pa.RecordBatch.from_arrays(arrays, names=names)
