"""Reading streamkit's internal topics safely: a malformed record is skipped, counted and said once.

Anyone who can write to the cluster can write to ``__streamkit_progress``, ``__streamkit_jobs``,
``__streamkit_status``, ``__streamkit_layouts``, ``__streamkit_layout_acks`` or
``__streamkit_autoscale``. A record there that
streamkit did not write (not JSON, or JSON of another shape) must not stop a worker or a command:
each reader decodes through :func:`decode_guarded`, which runs a strict decoder (one that raises on
anything it would not understand completely, before the record changes any state) and, when it
raises, skips the record: the reader goes on as if the record were not there, so what it held from
well-formed records stays as it was.

A skipped record is counted per topic (:func:`malformed_counts`, for status and metrics) and logged
once per process as ``topic[partition]@offset`` with why.

The shape helpers (:func:`obj`, :func:`rows`, :data:`INT`, ...) are what decoders check with.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import orjson

__all__ = [
    "BOOL",
    "INT",
    "NUMBER",
    "OBJECT",
    "OPT_INT",
    "OPT_STR",
    "STR",
    "Malformed",
    "Shape",
    "decode_guarded",
    "int_keyed",
    "list_of",
    "load_object",
    "malformed_counts",
    "obj",
    "optional",
    "required",
    "row_of",
    "rows",
    "str_keyed",
    "why_malformed",
]

log = logging.getLogger("streamkit.internal")

T = TypeVar("T")

REMEMBERED_PER_TOPIC = 10_000
"""How many skipped records per topic are remembered (so that one read again is neither counted
nor logged again); beyond, a record read again may be counted twice."""


class Malformed(ValueError):
    """A record of an internal topic does not have the shape streamkit writes."""


class RecordLike(Protocol):
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...


_lock = threading.Lock()
_counts: dict[str, int] = {}
_seen: dict[str, set[tuple[int, int]]] = {}


def malformed_counts() -> dict[str, int]:
    """Per internal topic, the malformed records this process skipped (each counted once)."""
    with _lock:
        return dict(_counts)


def _reset_for_tests() -> None:
    with _lock:
        _counts.clear()
        _seen.clear()


def why_malformed(exc: BaseException) -> str:
    """What a decoder's exception says of the record, in a few words."""
    if isinstance(exc, orjson.JSONDecodeError):
        return "not JSON"
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8"
    if isinstance(exc, Malformed):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def where(rec: RecordLike) -> str:
    """``topic[partition]@offset`` (``?`` for what is not known)."""
    part = str(rec.partition) if rec.partition >= 0 else "?"
    off = str(rec.offset) if rec.offset >= 0 else "?"
    return f"{rec.topic}[{part}]@{off}"


def decode_guarded(
    rec: RecordLike,
    decode: Callable[[], T],
    *,
    on_skip: Callable[[str], None] | None = None,
) -> T | None:
    """``decode()`` (a strict decoder of ``rec``), or None if it raises: then the record is
    counted (:func:`malformed_counts`), logged once as ``topic[partition]@offset`` with why, and
    ``on_skip(why)`` is called (every time)."""
    try:
        return decode()
    except Exception as exc:  # noqa: BLE001 - any failure to decode means: not a record we wrote
        why = why_malformed(exc)
    first = True
    with _lock:
        seen = _seen.setdefault(rec.topic, set())
        at = (rec.partition, rec.offset)
        if rec.offset >= 0 and at in seen:
            first = False
        else:
            _counts[rec.topic] = _counts.get(rec.topic, 0) + 1
            if rec.offset >= 0 and len(seen) < REMEMBERED_PER_TOPIC:
                seen.add(at)
    if first:
        log.warning("skipping a malformed record in %s: %s", where(rec), why)
    if on_skip is not None:
        on_skip(why)
    return None


# ---------------------------------------------------------------------- shapes

Shape = tuple[str, Callable[[Any], bool]]
"""A description (for messages) and a check of one value."""

INT: Shape = ("int", lambda v: isinstance(v, int) and not isinstance(v, bool))
OPT_INT: Shape = ("int|null", lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)))
NUMBER: Shape = ("number", lambda v: isinstance(v, int | float) and not isinstance(v, bool))
STR: Shape = ("str", lambda v: isinstance(v, str))
OPT_STR: Shape = ("str|null", lambda v: v is None or isinstance(v, str))
BOOL: Shape = ("bool", lambda v: isinstance(v, bool))
OBJECT: Shape = ("object", lambda v: isinstance(v, dict))


def list_of(item: Shape) -> Shape:
    return (f"[{item[0]}, ...]", lambda v: isinstance(v, list) and all(item[1](x) for x in v))


def row_of(*cols: Shape) -> Shape:
    desc = "[" + ", ".join(c[0] for c in cols) + "]"
    return (desc, lambda v: isinstance(v, list) and len(v) == len(cols) and all(c[1](x) for c, x in zip(cols, v)))


def _is_int_text(k: Any) -> bool:
    try:
        int(k)
    except (TypeError, ValueError):
        return False
    return isinstance(k, str)


def int_keyed(value: Shape) -> Shape:
    """An object whose keys are integers (as JSON writes them: text) and values ``value``."""
    return (
        f"{{int: {value[0]}}}",
        lambda v: isinstance(v, dict) and all(_is_int_text(k) and value[1](x) for k, x in v.items()),
    )


def str_keyed(value: Shape) -> Shape:
    return (f"{{str: {value[0]}}}", lambda v: isinstance(v, dict) and all(value[1](x) for x in v.values()))


def load_object(value: bytes | None) -> dict[str, Any]:
    """The JSON object ``value`` holds (Malformed if it holds anything else)."""
    return obj(orjson.loads(value or b""), "the record")


def obj(v: Any, what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise Malformed(f"{what} is not an object")
    return v


def required(d: Mapping[str, Any], name: str, shape: Shape) -> Any:
    """``d[name]``, which must be there and of ``shape``."""
    if name not in d:
        raise Malformed(f"{name} is missing")
    return _check(d[name], name, shape)


def optional(d: Mapping[str, Any], name: str, shape: Shape, default: Any = None) -> Any:
    """``d[name]`` if there (of ``shape``), else ``default``."""
    return _check(d[name], name, shape) if name in d else default


def rows(d: Mapping[str, Any], name: str, *cols: Shape) -> list[list[Any]]:
    """``d[name]`` if there: a list of rows of ``cols`` (else an empty list)."""
    found: list[list[Any]] = optional(d, name, list_of(row_of(*cols)), [])
    return found


def _check(v: Any, name: str, shape: Shape) -> Any:
    desc, ok = shape
    if not ok(v):
        if desc.startswith("[") and desc.endswith(", ...]"):
            inner = desc[1:-6]
            raise Malformed(f"{name} is not a list of {inner + 's' if inner in ('object', 'int', 'str') else inner}")
        raise Malformed(f"{name} is not {desc}")
    return v
