"""Serialisers between Python objects and the bytes a store holds.

A serde is any object with ``dumps(obj) -> bytes`` and ``loads(data) -> obj``.
The built-in ones are cheap on the encode side on purpose: ``CachedTable``
calls ``dumps`` once per dirty key at every checkpoint, so ``JsonSerde.dumps``
*is* ``orjson.dumps`` (no Python frame in between).  Decoding happens only on
cache misses and wraps every failure in :class:`SerdeError`, which names the
serde and shows a short repr of the offending bytes.
"""

from __future__ import annotations

import functools
import struct
from typing import Any, Protocol, cast, runtime_checkable

import orjson

__all__ = [
    "IntSerde",
    "JsonSerde",
    "RawSerde",
    "Serde",
    "SerdeError",
    "StrSerde",
    "serde_for",
    "short_repr",
]

_REPR_LIMIT = 32


def short_repr(data: Any, limit: int = _REPR_LIMIT) -> str:
    """``repr`` of ``data`` cut to about ``limit`` bytes, with the full length when cut."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        raw = bytes(data)
        if len(raw) <= limit:
            return repr(raw)
        return f"{bytes(raw[:limit])!r}... ({len(raw)} bytes)"
    text = repr(data)
    if len(text) <= limit * 2:
        return text
    return text[: limit * 2] + "..."


class SerdeError(ValueError):
    """Bytes that a serde cannot decode (or an object it cannot encode)."""

    def __init__(self, serde: str, data: Any, reason: str) -> None:
        self.serde = serde
        self.data = data
        self.reason = reason
        super().__init__(f"{serde} cannot decode {short_repr(data)}: {reason}")


@runtime_checkable
class Serde(Protocol):
    """What a store table needs to turn objects into bytes and back."""

    def dumps(self, obj: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class JsonSerde:
    """JSON via orjson; the default serde.

    ``option`` is passed to ``orjson.dumps`` (e.g. ``orjson.OPT_NON_STR_KEYS``).
    Note that JSON does not round-trip every Python value (tuples come back as
    lists, non-str dict keys need an option and come back as str).
    """

    name = "json"

    def __init__(self, option: int = 0) -> None:
        self.option = option
        # Bind the encoder directly: this is called per dirty key per checkpoint.
        self.dumps = orjson.dumps if option == 0 else functools.partial(orjson.dumps, option=option)  # type: ignore[method-assign, assignment]

    def dumps(self, obj: Any) -> bytes:  # pragma: no cover - replaced per instance
        return orjson.dumps(obj)

    def loads(self, data: bytes) -> Any:
        try:
            return orjson.loads(data)
        except (orjson.JSONDecodeError, TypeError) as exc:
            raise SerdeError("JsonSerde", data, str(exc)) from None

    def __repr__(self) -> str:
        return f"JsonSerde(option={self.option})" if self.option else "JsonSerde()"


class RawSerde:
    """Bytes passthrough; refuses anything that is not bytes-like."""

    name = "raw"

    def dumps(self, obj: Any) -> bytes:
        if type(obj) is bytes:
            return obj
        if isinstance(obj, (bytes, bytearray, memoryview)):
            return bytes(obj)
        raise TypeError(f"RawSerde needs bytes, got {type(obj).__name__}: {short_repr(obj)}")

    def loads(self, data: bytes) -> bytes:
        if type(data) is bytes:
            return data
        if isinstance(data, (bytearray, memoryview)):
            return bytes(data)
        raise SerdeError("RawSerde", data, f"expected bytes, got {type(data).__name__}")

    def __repr__(self) -> str:
        return "RawSerde()"


class StrSerde:
    """UTF-8 text."""

    name = "str"

    def dumps(self, obj: Any) -> bytes:
        if type(obj) is not str and not isinstance(obj, str):
            raise TypeError(f"StrSerde needs str, got {type(obj).__name__}: {short_repr(obj)}")
        return obj.encode("utf-8")

    def loads(self, data: bytes) -> str:
        try:
            return bytes(data).decode("utf-8")
        except (UnicodeDecodeError, TypeError) as exc:
            raise SerdeError("StrSerde", data, str(exc)) from None

    def __repr__(self) -> str:
        return "StrSerde()"


_INT64 = struct.Struct(">q")
_pack_q = _INT64.pack
_unpack_q = _INT64.unpack


def _len_or_type(data: Any) -> str:
    try:
        return str(len(data))
    except TypeError:
        return type(data).__name__


class IntSerde:
    """8-byte big-endian two's-complement integers.

    Byte order equals numeric order for non-negative values only: in a store's
    key order the negatives come after all non-negatives (still ascending among
    themselves).
    """

    name = "int"

    def dumps(self, obj: Any) -> bytes:
        try:
            return _pack_q(obj)
        except struct.error:
            if not isinstance(obj, int):
                raise TypeError(f"IntSerde needs int, got {type(obj).__name__}: {short_repr(obj)}") from None
            raise ValueError(f"IntSerde: {obj!r} does not fit in 8 signed bytes") from None

    def loads(self, data: bytes) -> int:
        try:
            return int(_unpack_q(data)[0])
        except (struct.error, TypeError):
            raise SerdeError("IntSerde", data, f"expected 8 bytes, got {_len_or_type(data)}") from None

    def __repr__(self) -> str:
        return "IntSerde()"


_BY_NAME: dict[str, type] = {
    "json": JsonSerde,
    "raw": RawSerde,
    "bytes": RawSerde,
    "str": StrSerde,
    "int": IntSerde,
}


def serde_for(spec: Any) -> Serde:
    """Resolve a serde from a name (``"json"``, ``"raw"``, ``"str"``, ``"int"``),
    a serde class (instantiated without arguments) or an object with callable
    ``dumps`` and ``loads`` (returned unchanged).  ``None`` means ``"json"``."""
    if spec is None:
        return JsonSerde()
    if isinstance(spec, str):
        cls = _BY_NAME.get(spec.lower())
        if cls is None:
            names = ", ".join(repr(n) for n in _BY_NAME)
            raise ValueError(f"unknown serde name {spec!r}; expected one of {names} or an object with dumps/loads")
        return cast(Serde, cls())
    if isinstance(spec, type):
        if callable(getattr(spec, "dumps", None)) and callable(getattr(spec, "loads", None)):
            return cast(Serde, spec())
    elif callable(getattr(spec, "dumps", None)) and callable(getattr(spec, "loads", None)):
        return cast(Serde, spec)
    raise TypeError(
        f"not a serde: {short_repr(spec)} (type {type(spec).__name__}); "
        "expected a name ('json', 'raw', 'str', 'int') or an object with dumps(obj) -> bytes and loads(bytes)"
    )
