"""Arrow column -> bytes with a table's (or topic's) serde, exactly as the runtime does.

The runtime stores ``serde.dumps(obj)``. The backfill receives Arrow columns from Spark;
for the common serdes the bytes are produced without a Python object per row where
that is provably identical (UTF-8 strings for ``StrSerde``, bytes for ``RawSerde``,
8-byte big-endian for ``IntSerde``); every other case converts each element to the
Python object Spark's row would give (structs -> dict, maps -> dict, lists -> list)
and calls the serde's own ``dumps``. The tests compare both paths.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from stores.serde import IntSerde, JsonSerde, RawSerde, Serde, StrSerde

__all__ = ["EncodeError", "decode_to_text", "encode_array", "to_python"]


class EncodeError(ValueError):
    """A column cannot be encoded with the serde (wrong type, nulls where not allowed)."""


def _fast_path(serde: Serde, arr: pa.Array) -> pa.Array | None:
    t = arr.type
    if type(serde) is StrSerde and (pa.types.is_string(t) or pa.types.is_large_string(t)):
        return arr.cast(pa.large_binary())  # zero-copy reinterpretation of the UTF-8 bytes
    if type(serde) is RawSerde and (
        pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
    ):
        return arr.cast(pa.large_binary())  # bytes as they are; text as its UTF-8 bytes
    if type(serde) is IntSerde and pa.types.is_integer(t):
        if arr.null_count:
            return None
        ints = arr.cast(pa.int64()).to_numpy(zero_copy_only=False).astype(">i8")
        data = pa.py_buffer(ints.tobytes())
        offsets = pa.py_buffer(np.arange(0, 8 * (len(arr) + 1), 8, dtype=np.int64).tobytes())
        return pa.Array.from_buffers(pa.large_binary(), len(arr), [None, offsets, data])
    return None


_CHUNK = 4096

_NEEDS_ESCAPE = r'["\\\x00-\x1f]'  # what JSON (and orjson) escapes in a string


def _json_text(arr: pa.Array) -> pa.Array | None:
    """``orjson.dumps`` of every element as Arrow string compute, or None when that is not
    provably identical: ints, bools, strings without characters JSON escapes, and
    structs of those (nested), nulls as ``null``. Floats, temporals, lists and maps go
    through orjson itself (their text forms differ between Arrow and orjson)."""
    import pyarrow.compute as pc

    t = arr.type
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        text = arr.cast(pa.large_string())
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        if len(arr) and pc.any(pc.match_substring_regex(arr, _NEEDS_ESCAPE)).as_py():
            return None
        text = pc.binary_join_element_wise(_lit('"'), arr.cast(pa.large_string()), _lit('"'), _lit(""))
    elif pa.types.is_struct(t):
        if t.num_fields == 0:
            return None
        import orjson

        children = arr.flatten()
        parts: list[Any] = []
        for i, child in enumerate(children):
            sub = _json_text(child)
            if sub is None:
                return None
            name = orjson.dumps(t.field(i).name).decode()
            parts.append(_lit(("{" if i == 0 else ",") + name + ":"))
            parts.append(sub)
        parts.append(_lit("}"))
        text = pc.binary_join_element_wise(*parts, _lit(""))
        if arr.null_count:  # a null struct is null, not an object of nulls
            text = pc.if_else(arr.is_valid(), text, pa.scalar(None, pa.large_string()))
    else:
        return None
    if text.null_count:
        text = pc.fill_null(text, _lit("null"))
    return text


def _lit(s: str) -> pa.Scalar:
    return pa.scalar(s, pa.large_string())


def to_python(arr: pa.Array) -> list[Any]:
    """Elements as the Python objects a handler would see (maps become dicts)."""
    values = arr.to_pylist()
    if _has_map(arr.type):
        return [_maps_to_dicts(v) for v in values]
    return values


def _has_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_map(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_map(t.value_type)
    return False


def _maps_to_dicts(v: Any) -> Any:
    if isinstance(v, list):
        if v and all(isinstance(x, tuple) and len(x) == 2 for x in v):
            return {k: _maps_to_dicts(x) for k, x in v}
        return [_maps_to_dicts(x) for x in v]
    if isinstance(v, dict):
        return {k: _maps_to_dicts(x) for k, x in v.items()}
    return v


def encode_array(serde: Serde, arr: pa.Array | pa.ChunkedArray, *, what: str, nulls: str = "error") -> pa.Array:
    """Encode every element with ``serde``; returns a ``large_binary`` array.

    ``nulls``: ``"error"`` refuses null elements, ``"keep"`` keeps them as nulls (a
    null value is "no value": the backfill drops such rows or passes them to the
    handler as ``None``).
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if arr.null_count and nulls == "error":
        raise EncodeError(f"{what}: {arr.null_count} null value(s); nulls are not allowed here")
    fast = _fast_path(serde, arr)
    if fast is not None:
        return fast
    if type(serde) is JsonSerde and serde.option == 0:
        text = _json_text(arr)
        if text is not None:
            out_arr = text.cast(pa.large_binary())
            if arr.null_count:  # a null value stays null (no value), not the text "null"
                import pyarrow.compute as pc

                out_arr = pc.if_else(arr.is_valid(), out_arr, pa.scalar(None, pa.large_binary()))
            return out_arr
    dumps: Callable[[Any], bytes] = serde.dumps
    # In chunks: orjson.dumps results each pin ~4 KiB of heap until freed (its output
    # buffer is shrunk in place), so a whole batch of them at once costs hundreds of MB.
    chunks = []
    try:
        for start in range(0, len(arr), _CHUNK):
            part = arr.slice(start, _CHUNK)
            if part.null_count:
                out = [None if v is None else dumps(v) for v in to_python(part)]
            else:
                out = [dumps(v) for v in to_python(part)]
            chunks.append(pa.array(out, type=pa.large_binary()))
            del out
    except Exception as exc:  # noqa: BLE001 - the serde's own error, with context
        raise EncodeError(f"{what}: {serde!r} cannot encode a {arr.type} value: {type(exc).__name__}: {exc}") from exc
    if not chunks:
        return pa.array([], type=pa.large_binary())
    return pa.concat_arrays(chunks) if len(chunks) > 1 else chunks[0]


def decode_to_text(serde: Serde, values: list[bytes]) -> list[str | None]:
    """Stored bytes -> readable text: JSON text for JSON, the string for str, else the
    JSON rendering of ``serde.loads`` (for the store reader's ``decode`` option)."""
    import orjson

    if type(serde) is JsonSerde or type(serde) is StrSerde:
        return [v.decode("utf-8") if v is not None else None for v in values]
    out: list[str | None] = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        obj = serde.loads(v)
        if isinstance(obj, bytes):
            out.append(obj.hex())
        else:
            out.append(orjson.dumps(obj, default=str).decode())
    return out
