"""Test an app without a broker: feed records, move time, read tables, output and dead
letters, in milliseconds (as Kafka Streams' ``TopologyTestDriver``).

Everything after fetching is the worker's own code: each partition's records go through
the worker's admission (``runtime.admission``: IC ranges after a restart, the placement
check of keys a plain producer wrote, unreadable record times) and the processor's
task (``runtime.task``: the apply step and the time-ordered merge of its input partitions), then are
decoded and applied by the worker's ``Dispatcher`` through the routes a worker builds (tables and their
write-back caches over real RocksDB stores in a temporary directory, windows with
stream time, late records, key-level concurrency with per-key order, dead letters), sent
through the worker's ``Output``, checkpointed by the worker's commit step and fired by
the worker's timers. What the driver stands in for is the broker: each input topic is a
list of records per partition, with as many partitions as the job has processors, a key
placed where a streamkit producer places it (linear hashing) and partition ``q`` read by
processor ``q``; output goes to a list instead of a topic. With ``partitions`` other than
the processor count, the input topics have that many partitions and the processors read
them as a worker's would: several whole partitions each, or shares of one (each sharer
applying its keys) when there are more processors than partitions. What needs a broker is left
out, and only that: a topic's layout changes (gates, epoch stamps, swept partitions) and
holes in a partition's offsets, which the driver's lists never have.

Time: the driver has its own wall clock, in seconds, starting at ``start_time``. A
record sent without a timestamp gets the clock's; ``advance`` moves the clock and fires
the ``@app.every`` timers that fall due, in order. Nothing runs in the background: the
same calls give the same tables, output and dead letters on every run.

Crashes: ``checkpoint`` commits every processor's state and positions as the worker
does; ``restart`` drops what was not checkpointed and applies again, with output, every
record beyond the checkpoint (exact state, at-least-once output, as a worker restarted
after SIGKILL).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import shutil
import tempfile
from collections.abc import Coroutine, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from aiokafka import TopicPartition

from assignors.group import TopicShape, place_job
from assignors.linear_hashing import partition_for_key
from streamkit.app import App, HandlerSpec
from streamkit.checkpoint_keys import PROCESSOR_COUNT
from streamkit.context import Header
from streamkit.joins.global_store import GlobalStores
from streamkit.joins.merge import TimeMerge
from streamkit.layout.seal import OriginSeal
from streamkit.layout.strays import plain_rule
from streamkit.runtime import checkpointing, timers
from streamkit.runtime.admission import Admission
from streamkit.runtime.dispatch import Dispatcher
from streamkit.runtime.output import Output
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.routes import Route, SlotPlace
from streamkit.runtime.task import Task, apply_fetched
from streamkit.testdriver.capture import (
    CaptureProducer,
    DeadLetter,
    OutputRecord,
    decode_dead_letter,
    decode_output,
)
from streamkit.topics import Topic

__all__ = ["TestDriver"]

T = TypeVar("T")


class InputRecord:
    """One input record as the worker's code reads a fetched one."""

    __slots__ = ("topic", "partition", "offset", "timestamp", "key", "value", "headers", "kafka_timestamp")

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header],
    ) -> None:
        self.topic, self.partition, self.offset, self.timestamp = topic, partition, offset, timestamp
        self.key, self.value, self.headers = key, value, headers
        self.kafka_timestamp: int | None = None
        """The timestamp as written, once a topic's ``timestamp=`` has replaced it."""


class TestDriver:
    """Runs ``app`` in this process, without a broker (see the module docstring).

    >>> import streamkit
    >>> app = streamkit.App("orders")
    >>> totals = app.table("customer_totals", default=lambda: {"amount": 0})
    >>> @app.processor(app.topic("orders"))
    ... def total(key, value, ctx):
    ...     totals[key] = {"amount": totals[key]["amount"] + value["amount"]}
    >>> with TestDriver(app) as driver:
    ...     _ = driver.send("orders", "alice", {"amount": 100})
    ...     assert driver.table("customer_totals")["alice"]["amount"] == 100
    """

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(
        self, app: App, processors: int | None = None, *, partitions: int | None = None, start_time: float = 0.0
    ) -> None:
        if not app.handlers:
            raise ValueError(f"app {app.name!r} has no @app.processor handler: nothing to drive")
        self.app = app
        self.processors = processors or app.processor_count or 1
        """The job's processors."""
        self.partitions = partitions or self.processors
        """Every input topic's partitions."""
        self.now = start_time
        """The driver's wall clock, seconds."""
        self._loop = asyncio.new_event_loop()
        self._dir = Path(tempfile.mkdtemp(prefix=f"streamkit-driver-{app.name}-"))
        self._log: dict[tuple[str, int], list[InputRecord]] = {}
        self._round_robin = itertools.count()
        self._producer = CaptureProducer()
        self._next_fire = {id(spec): start_time + spec.seconds for spec in app.timers}
        self._tasks: dict[int, Task] = {}
        self._seal = OriginSeal.ephemeral()
        """The driver's cluster seal: on the strays its output forwards, checked by its admission."""
        self._admission = self._new_admission()
        self._output = Output(app.name, app.dead_letter_topic, app.topics, self._producer, self._seal)
        self._dispatcher = self._new_dispatcher()
        self._globals = (
            GlobalStores(list(app.global_tables.values()), self._dir / app.name) if app.global_tables else None
        )
        self._open()

    # -- the test's side ----------------------------------------------------------------

    def __enter__(self) -> TestDriver:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @property
    def _procs(self) -> dict[int, ProcessorState]:
        return {pid: task.proc for pid, task in self._tasks.items()}

    def close(self) -> None:
        """Close the stores and remove them (the driver cannot be used after)."""
        for task in self._tasks.values():
            task.close()
        self._tasks.clear()
        if self._globals is not None:
            self._globals.close()
        self._loop.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def send(
        self,
        topic: str,
        key: Any,
        value: Any,
        *,
        timestamp: float | None = None,
        headers: Iterable[Header] = (),
    ) -> None:
        """Write one record to input ``topic`` (encoded with its serdes; ``value`` may be
        ``bytes`` as they are, to test a record that does not decode) and apply it.
        ``timestamp``: seconds (default: the driver's clock). A global table's topic
        updates the table at once (as a worker reads it before its next record)."""
        if self._feed_global(topic, key, value, headers) and topic not in self.app.handlers:
            return
        spec = self._handlers(topic)[0].topic
        kb = key if isinstance(key, bytes) else spec.encode_key(key)
        vb = value if isinstance(value, bytes) else spec.encode_value(value)
        n = self.partitions
        part = partition_for_key(kb, n, n) if kb is not None else next(self._round_robin) % n
        log = self._log.setdefault((topic, part), [])
        ts = self.now if timestamp is None else timestamp
        log.append(InputRecord(topic, part, len(log), round(ts * 1000), kb, vb, tuple(headers)))
        self._run(self._pump())

    def _feed_global(self, topic: str, key: Any, value: Any, headers: Iterable[Header]) -> bool:
        """Apply a record of a global table's topic to that table; False: no such table."""
        fed = False
        for store in self._globals.stores if self._globals is not None else ():
            spec = store.table.topic
            if spec.name != topic:
                continue
            kb = key if isinstance(key, bytes) else spec.encode_key(key)
            vb = value if isinstance(value, bytes) else spec.encode_value(value)
            offset = store.positions.get(0, 0)  # the driver's topic: one partition, in the store's positions
            record = InputRecord(topic, 0, offset, round(self.now * 1000), kb, vb, tuple(headers))
            store.apply([record], {0: offset + 1})
            fed = True
        return fed

    def advance(self, seconds: float) -> None:
        """Move the wall clock on by ``seconds``, firing the timers that fall due (in time
        order; one due several times fires that many times)."""
        if seconds < 0:
            raise ValueError(f"time moves forward only: advance({seconds!r})")
        end = self.now + seconds
        while True:
            due = [(self._next_fire[id(s)], i, s) for i, s in enumerate(self.app.timers)]
            due = [d for d in due if d[0] <= end]
            if not due:
                break
            at, _, spec = min(due)
            self.now = at
            self._next_fire[id(spec)] = at + spec.seconds
            self._run(timers.fire(spec, self._procs.values(), self.app.tables, self._output, now=self._clock))
        self.now = end
        if self.app.settings.close_on == "wall":  # the worker's wall tick, on the driver's clock
            wall_ms = int((self.now - self.app.settings.close_allowance) * 1000)
            for task in self._tasks.values():
                self._run(task.tick_wall(wall_ms))
            self._run(self._dispatcher.send_output())

    def table(self, name: str) -> dict[Any, Any]:
        """Table ``name`` as the handlers see it now (checkpointed or not), every
        processor's keys in one dict; a windowed table's keys are ``(key, window start ms)``."""
        if name not in self.app.tables:
            raise KeyError(f"app {self.app.name!r} has no table {name!r} (tables: {', '.join(self.app.tables)})")
        out: dict[Any, Any] = {}
        for proc in self._procs.values():
            for key, value in proc.caches[name].items():
                if key in out:  # placement sends a key to one processor: this is a bug
                    raise RuntimeError(f"table {name!r}: key {key!r} is in two processors' state")
                out[key] = value
        return out

    def windows(self, name: str) -> dict[tuple[Any, int], Any]:
        """Windowed table ``name``'s windows held now, every processor's, as
        ``(key, window start ms) -> value`` (a sliding window's value computed from its
        records, which is all its table stores)."""
        found = [proc.window_states[name] for proc in self._procs.values() if name in proc.window_states]
        if not found:
            raise KeyError(f"app {self.app.name!r} has no windowed table {name!r}")
        return {(key, window.start): value for state in found for key, window, value in state.held()}

    def output(self, topic: str) -> list[OutputRecord]:
        """Every record sent to ``topic`` so far, in the order sent (after a restart, what
        was sent again too: output is at least once)."""
        spec = self.app.topics.get(topic) or Topic.declare(topic)  # an undeclared one: the defaults, as Output
        return [decode_output(s, spec) for s in self._producer.sent if s.topic == topic]

    def dead_letters(self) -> list[DeadLetter]:
        """Every input record sent to the dead letters so far, with its reason."""
        topic = self.app.dead_letter_topic
        return [decode_dead_letter(s) for s in self._producer.sent if s.topic == topic]

    def checkpoint(self) -> None:
        """Commit every processor's state and input positions, as a worker's checkpoint
        does (windows past their retention are deleted here)."""
        self._run(self._output.flush())
        checkpointing.commit_stores(self._tasks.values(), {}, 0, {PROCESSOR_COUNT: self.processors})

    def restart(self) -> None:
        """A crash and a restart: drop what was not checkpointed, reopen the stores and
        apply every record beyond the checkpoint again (with output)."""
        for task in self._tasks.values():
            task.close(discard=True)
        self._tasks.clear()
        self._admission = self._new_admission()
        self._dispatcher = self._new_dispatcher()
        self._open()

    # -- the worker's side ------------------------------------------------------------

    def _clock(self) -> float:
        return self.now

    def _new_dispatcher(self) -> Dispatcher:
        dispatcher = Dispatcher(
            f"{self.app.name}-driver", self.app.tables, self._output,
            failure_alarm_after=self.app.settings.failure_alarm_after,
            close_callbacks=self.app.window_close_callbacks, late_callbacks=self.app.late_callbacks,
        )  # fmt: skip
        dispatcher.run_budget = math.inf  # deterministic: no wall-clock cut
        return dispatcher

    def _new_admission(self) -> Admission:
        """The worker's admission over the driver's lists (nothing to pause or seek)."""
        return Admission(_Lists(), group=self.app.group_id, name=f"{self.app.name}-driver", seal=self._seal)

    def _unadmitted(self, pid: int, source: tuple[str, int]) -> bool:
        """Whether processor ``pid``'s ``source`` has records its route has not admitted
        (the merge waits for them, as a member's for a partition its fetches have not
        brought yet): within one batch, each processor's partitions are merged by time."""
        route = self._tasks[pid].routes.get(TopicPartition(*source))
        return route is not None and route.position < len(self._log.get(source, ()))

    def _handlers(self, topic: str) -> list[HandlerSpec]:
        found = self.app.handlers.get(topic)
        if not found:
            raise KeyError(
                f"app {self.app.name!r} has no handler for topic {topic!r} (inputs: {self.app.input_topics})"
            )
        return found

    def _open(self) -> None:
        """Open every processor's store and its partitions' routes, where its checkpoint is,
        placed as a worker's assignment places them (``assignors.group.place_job``)."""
        n, p = self.partitions, self.processors
        for pid in range(p):
            path = self.app.store_path(pid, self._dir)
            proc = self._run(ProcessorState.open(pid, path, self.app.tables, timeout=5.0))
            # every record sent is there: a partition lags only until admitted, and none is waited for more
            self._tasks[pid] = Task(proc, self._dispatcher, TimeMerge(0), self._unadmitted)
        placed = place_job({t: TopicShape(n, n) for t in self.app.input_topics}, p, p)  # (the job's p0: p)
        assigned: dict[ProcessorState, list[Any]] = {}
        for pid, slots in sorted(placed.slots.items()):
            task = self._tasks[pid]
            proc = task.proc
            for topic, part, key_filter in slots:
                sharers = placed.sharers.get((topic, part), ()) if key_filter is not None else ()
                route = Route.for_slot(
                    proc, self._handlers(topic), (topic, part), 0, None, SlotPlace(key_filter, sharers, p, p)
                )
                route.strays = plain_rule(part, n)  # where the worker's keys of a topic with no layout belong
                task.read(TopicPartition(topic, part), route)
                self._admission.add(TopicPartition(topic, part), route)
                assigned.setdefault(proc, []).append((topic, part))
        self._run(self._dispatcher.fire(self.app.keys_assigned_callbacks, assigned))
        self._run(self._pump())

    async def _pump(self) -> None:
        """Apply what each partition holds beyond its route's position, as a member's
        batch: each partition's records admitted and applied by their task, then each
        task's end of batch and the queued records of key-concurrent routes until none is
        left, then the output."""
        admission = self._admission
        fetched = {
            tp: self._log.get((tp.topic, tp.partition), [])[admission.fetch_position(tp) :] for tp in admission.routes
        }
        await apply_fetched(admission, self._tasks, fetched)  # (nothing to pause: every record is there)
        for task in self._tasks.values():
            for route in task.routes.values():
                while route.scheduler is not None and route.scheduler.queued:
                    await self._dispatcher.run_queued(route)
        await self._dispatcher.send_output()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coro)


class _Lists:
    """The consumer admission drives, for lists: nothing to pause or seek (no gates, no
    holes)."""

    def pause(self, *partitions: TopicPartition) -> None:
        pass

    def resume(self, *partitions: TopicPartition) -> None:
        pass

    def seek(self, partition: TopicPartition, offset: int) -> None:
        pass
