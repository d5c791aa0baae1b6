"""Inputs merged in time order: a processor that reads several partitions, of one topic
or of several, applies their records by timestamp, as Kafka Streams' tasks do
(``max.task.idle.ms``).

Why: a handler of ``orders`` that reads a table fed by ``customers`` must see the
customer as it was when the order was placed, whatever the fetches delivered first; and
a processor that reads two partitions of one topic must not judge one partition's
records late against the other's newer ones because a fetch brought that one first. A
live run, a restart and a rebuild then apply the same records in the same order, and
decide alike what is late and when a window closes.

How: each processor has one queue per partition it reads (a *source*). Admission puts
the records it would apply into their partition's queue in offset order;
:meth:`TimeMerge.release` then takes, again and again, the head with the smallest
(timestamp, topic, partition, offset), as long as no other source of the processor with
an empty queue may still bring an earlier record: one with records fetched by nobody
yet (lag: ``lagging``), or one that has been empty for less than the idle wait while
others had records (as Kafka Streams' deadline: once passed, a quiet partition holds
nothing back until it brings a record again). A held record is *pending* for its
partition until the run it is released in was applied (``TimeMerge.applied``): a
checkpoint records the stable offset below it (and IC ranges beyond), so a crash re-reads
it. Gates see held records as not applied (they look at stable offsets), so a partition
whose keys came from another after a layout change delivers only once that one's records
below the seal went out of the merge: per-key order stands.

The merge looks at heads only, as Kafka Streams' does: within a partition records keep
their offset order, so a record stuck behind a later timestamp waits for it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

__all__ = ["LONG_WAIT_SECONDS", "MergeRoute", "Run", "Source", "TimeMerge"]

Source = tuple[str, int]
"""One input of the merge: a (topic, partition) the processor reads."""

log = logging.getLogger(__name__)

LONG_WAIT_SECONDS = 5.0
"""A processor that waits this long for a partition said to have records not fetched yet
(its high watermark beyond what was handed over) says so, once per wait, in the log and
the metric ``streamkit_merge_long_waits_total``. It goes on waiting, as Kafka Streams'
tasks do while a partition lags (KIP-695): going on without the partition would judge
its records late against the others' time, and they are not late."""


class _Proc(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def pending(self) -> dict[Any, set[int]]: ...


class MergeRoute(Protocol):
    """What the merge needs of a route (``streamkit.runtime.routes.Route``)."""

    @property
    def proc(self) -> _Proc: ...
    @property
    def position_key(self) -> tuple[str, int]: ...


Run = tuple[Any, list[Any], list[Any]]
"""(route, records to rebuild without output, records to deliver): consecutive released
records of one route."""

Lagging = Callable[[int, Source], bool]
"""``lagging(processor, source)``: the partition has records for the processor that no
fetch has brought yet."""


class TimeMerge:
    """The merge queues of one task's processor (live, or a rebuild's)."""

    def __init__(self, idle_ms: int) -> None:
        self.idle = idle_ms / 1000 if idle_ms >= 0 else -1.0
        self.inputs: dict[int, frozenset[Source]] = {}
        """Per processor, the sources merged (set by :meth:`set_inputs`); one source or
        none: its records pass at once."""
        self._queues: dict[int, dict[Source, deque[tuple[Any, Any, bool]]]] = {}
        self._empty_since: dict[tuple[int, Source], float] = {}
        self._lag_since: dict[tuple[int, Source], float] = {}
        self._told: set[tuple[int, Source]] = set()
        """Sources said to lag that brought nothing for ``LONG_WAIT_SECONDS``: told once
        per wait."""
        self.held = 0
        """Records held now."""
        self.long_waits = 0
        """Times a partition said to lag brought nothing for ``LONG_WAIT_SECONDS``."""

    # -- what is merged --------------------------------------------------------------------
    def set_inputs(self, routes: Iterable[tuple[int, Source]]) -> None:
        """The (processor, source) pairs whose records are merged: every input route but
        those read only to forward strays and the key-concurrent ones."""
        sources: dict[int, set[Source]] = {}
        for pid, source in routes:
            sources.setdefault(pid, set()).add(source)
        self.inputs = {pid: frozenset(t) for pid, t in sources.items() if len(t) > 1}

    def queued(self, pid: int, source: Source) -> int:
        """Records held for processor ``pid`` from ``source``."""
        queue = self._queues.get(pid, {}).get(source)
        return len(queue) if queue else 0

    def merges(self, route: MergeRoute) -> bool:
        return len(self.inputs.get(route.proc.id, ())) > 1

    # -- in and out --------------------------------------------------------------------------
    def passes(self, route: MergeRoute, now: float, lagging: Lagging) -> bool:
        """Whether a batch of ``route`` may be applied at once, unheld: its processor holds
        nothing and no other source of it may bring an earlier record (what :meth:`release`
        would let through anyway, without a hold and a release per record)."""
        pid, source = route.proc.id, route.position_key
        self._brought(pid, source)  # held or not, the partition brought records: its silence ended
        if self._queues.get(pid) and any(self._queues[pid].values()):
            return False
        others = [t for t in self.inputs.get(pid, ()) if t != source]
        return not any(self._may_bring_earlier(pid, t, now, lagging) for t in others)

    def _brought(self, pid: int, source: Source) -> None:
        self._empty_since.pop((pid, source), None)
        self._lag_since.pop((pid, source), None)
        self._told.discard((pid, source))

    def hold(self, route: MergeRoute, rebuild: list[Any], deliver: list[Any]) -> None:
        """Queue a route's admitted records (rebuild ones, then delivered ones, in offset
        order); each is pending for its partition until released."""
        if not rebuild and not deliver:
            return
        pid, source = route.proc.id, route.position_key
        queue = self._queues.setdefault(pid, {}).setdefault(source, deque())
        pending = route.proc.pending.setdefault(route.position_key, set())
        for records, again in ((rebuild, True), (deliver, False)):
            for rec in records:
                queue.append((route, rec, again))
                pending.add(rec.offset)
        self.held += len(rebuild) + len(deliver)
        self._brought(pid, source)

    @staticmethod
    def applied(run: Run) -> None:
        """A released run was applied: its records are no longer pending. Not at release:
        a batch lets the event loop take turns between runs, and what reads the stable
        positions meanwhile (heartbeats, status) would count records not applied yet."""
        route, rebuild, deliver = run
        pending = route.proc.pending.get(route.position_key)
        if pending is not None:
            pending.difference_update(rec.offset for rec in (*rebuild, *deliver))

    def release(self, now: float, lagging: Lagging, flush: bool = False) -> list[Run]:
        """The records that may be applied now, in merged order, as runs of one route.
        ``flush``: all of them, waiting for nothing."""
        runs: list[Run] = []
        for pid, queues in self._queues.items():
            if self.held == 0:
                break
            self._release_one(pid, queues, now, lagging, flush, runs)
        return runs

    def _release_one(
        self, pid: int, queues: dict[Source, deque[tuple[Any, Any, bool]]], now: float, lagging: Lagging, flush: bool,
        runs: list[Run],
    ) -> None:  # fmt: skip
        inputs = self.inputs.get(pid, ())
        while True:
            full = [(source, q) for source, q in queues.items() if q]
            if not full:
                return
            if not flush:
                filled = {source for source, _ in full}
                empty = [t for t in inputs if t not in filled]
                if any(self._may_bring_earlier(pid, source, now, lagging) for source in empty):
                    return  # an empty partition may still bring the earliest record
            if len(full) == 1:
                self._take_all(full[0][1], runs)
                continue
            while all(q for _, q in full):  # the order among these is known until one runs dry
                self._take_head(full, runs)

    def _take_head(self, full: list[tuple[Source, deque[tuple[Any, Any, bool]]]], runs: list[Run]) -> None:
        best_q = None
        best_key: tuple[int, str, int, int] | None = None
        for (topic, partition), q in full:
            rec = q[0][1]
            key = (rec.timestamp, topic, partition, rec.offset)
            if best_key is None or key < best_key:
                best_key, best_q = key, q
        assert best_q is not None
        self._emit(best_q.popleft(), runs)

    def _take_all(self, q: deque[tuple[Any, Any, bool]], runs: list[Run]) -> None:
        while q:
            self._emit(q.popleft(), runs)

    def _emit(self, entry: tuple[Any, Any, bool], runs: list[Run]) -> None:
        route, rec, again = entry
        self.held -= 1  # (it stays pending until the taker applied its run: ``applied``)
        if runs and runs[-1][0] is route:  # a route's rebuilt records come before its delivered ones
            runs[-1][1 if again else 2].append(rec)
            return
        runs.append((route, [rec], []) if again else (route, [], [rec]))

    def _may_bring_earlier(self, pid: int, source: Source, now: float, lagging: Lagging) -> bool:
        """Whether ``source``'s empty queue holds the processor's other inputs back."""
        if self.idle < 0:
            return False
        if lagging(pid, source):
            since = self._lag_since.setdefault((pid, source), now)
            if now - since >= LONG_WAIT_SECONDS and (pid, source) not in self._told:
                self.long_waits += 1
                self._told.add((pid, source))  # once per wait: until it brings a record or stops lagging
                log.warning("processor %d waits for %s: it has records not fetched yet and brought none for %.0f s "
                            "(its other inputs wait with it: going on would judge its records late)", pid,
                            f"{source[0]}[{source[1]}]", LONG_WAIT_SECONDS)  # fmt: skip
            return True
        self._lag_since.pop((pid, source), None)
        self._told.discard((pid, source))
        since = self._empty_since.setdefault((pid, source), now)
        return now - since < self.idle

    # -- when routes go ----------------------------------------------------------------------
    def drop(self, pid: int) -> None:
        """Forget a processor's held records (its routes are gone; its positions go back
        to its checkpoint, which has them pending: they are fetched again)."""
        queues = self._queues.pop(pid, {})
        self.held -= sum(len(q) for q in queues.values())
        for key in [k for k in self._empty_since if k[0] == pid]:
            del self._empty_since[key]
        for key in [k for k in self._lag_since if k[0] == pid]:
            del self._lag_since[key]
        self._told = {k for k in self._told if k[0] != pid}

    def clear(self) -> None:
        for pid in list(self._queues):
            self.drop(pid)
        self.inputs = {}
