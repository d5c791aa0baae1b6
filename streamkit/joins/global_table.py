"""Global tables: a whole topic's latest value per key, on every worker, for lookups by
any key (Kafka Streams' ``GlobalKTable``, faust's ``GlobalTable``).

A handler reads a global table (``products.get(product_id)``) whatever the record's
key, which is how a foreign-key join is written: no co-partitioning is needed, since
every worker holds every key. Handlers never write it: the topic is its only writer.
The declaration lives here; the copy a worker keeps is ``streamkit.joins.global_store``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from streamkit.topics import Topic


class GlobalTableBackend(Protocol):
    """What a global table reads through, once a worker (or the test driver) holds it."""

    def get(self, key: Any, default: Any = None) -> Any: ...
    def __len__(self) -> int: ...


class _NotHeld:
    def __init__(self, name: str) -> None:
        self.name = name

    def _fail(self) -> RuntimeError:
        return RuntimeError(
            f"global table {self.name!r} is read only inside a running worker or a TestDriver (it holds no data here)"
        )

    def get(self, key: Any, default: Any = None) -> Any:
        raise self._fail()

    def __len__(self) -> int:
        raise self._fail()


class GlobalTable:
    """The latest value of each key of ``topic`` (a tombstone deletes it), decoded with
    the topic's serdes; read-only.

    Every worker reads the whole topic into a local store before any of its processors
    applies a record, then follows it. Lookups are not ordered with the processors'
    input: a record sees the table as the worker had read it then (as in Kafka Streams)."""

    def __init__(self, name: str, topic: Topic) -> None:
        self.name = name
        self.topic = topic
        self._backend: GlobalTableBackend = _NotHeld(name)

    def bind(self, backend: GlobalTableBackend | None) -> None:
        """Read through ``backend`` (None: nothing, again)."""
        self._backend = backend if backend is not None else _NotHeld(self.name)

    def get(self, key: Any, default: Any = None) -> Any:
        return self._backend.get(key, default)

    def __getitem__(self, key: Any) -> Any:
        value = self._backend.get(key, _ABSENT)
        if value is _ABSENT:
            raise KeyError(key)
        return value

    def __contains__(self, key: Any) -> bool:
        return self._backend.get(key, _ABSENT) is not _ABSENT

    def __len__(self) -> int:
        return len(self._backend)

    def __iter__(self) -> Iterator[Any]:
        raise TypeError(f"global table {self.name!r} is for lookups by key; it is not iterated")

    def __repr__(self) -> str:
        return f"GlobalTable({self.name!r}, source={self.topic.name!r})"


_ABSENT: Any = object()
