"""Dispatch: decode records, call the handlers, send what failed to the dead letters.

The hot loop lives here (`Dispatcher.apply`). It is written for throughput: the
context object is reused, tables are bound once per partition batch, and output is
collected in an outbox and sent in bulk after the batch.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import Any

import orjson

from streamkit.context import Context, Outbox
from streamkit.ops.metrics import Durations
from streamkit.runtime.admission import Admitted
from streamkit.runtime.binding import TableBinder
from streamkit.runtime.closes import CloseCallbacks, fire_closes
from streamkit.runtime.output import Output
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.routes import Route
from streamkit.tables import Table
from streamkit.windows import LateRecordError

log = logging.getLogger(__name__)

Failure = tuple[Any, str, BaseException, str]  # (record, reason, exception, handler name)

RUN_BUDGET = 0.05
"""Seconds a key-concurrent route runs its queued records per call before the member
fetches again (queued records of busy keys wait; other keys' records keep coming)."""

TURN_AFTER = 0.1
"""Seconds of handlers in a row after which a batch lets the event loop take a turn (the
group's heartbeats, the job watcher) before it goes on. A handler that blocks 1 ms per
record (a call to another service) would otherwise hold the loop for a whole fetch answer,
thousands of records in a rebuild, and its worker would miss its group session. The batch
holds the member's lock through the turn: nothing else applies records meanwhile."""
TURN_PAUSE = 0.001
"""Seconds a turn lasts (1% of a blocking handler's time)."""
TURN_CHECK = 7
"""The clock is read every ``TURN_CHECK + 1`` records (a mask: one AND per record): a
handler of 50 ms per record still takes a turn within half a second."""


_RUNNING: ContextVar[Context | None] = ContextVar("streamkit_running_context", default=None)
"""The context of the record a key-concurrent handler task runs (each task has its own)."""


class _Clock:
    """What windowed tables read the time from: the running key-concurrent record's
    context inside its task, else the member's shared context."""

    __slots__ = ("_shared",)

    def __init__(self, shared: Context) -> None:
        self._shared = shared

    @property
    def timestamp(self) -> int:
        return (_RUNNING.get() or self._shared).timestamp

    @property
    def stream_time(self) -> int:
        return (_RUNNING.get() or self._shared).stream_time

    @property
    def record(self) -> Any:
        """The record being handled (count windows count each once)."""
        return (_RUNNING.get() or self._shared)._rec


class Dispatcher:
    """Applies admitted records of one group member to its processors' state."""

    def __init__(
        self,
        name: str,
        tables: Mapping[str, Table],
        output: Output,
        *,
        failure_alarm_after: int,
        close_callbacks: CloseCallbacks | None = None,
        late_callbacks: CloseCallbacks | None = None,
    ) -> None:
        self.name = name
        self.close_callbacks: CloseCallbacks = close_callbacks or {}
        """Per windowed table, its ``@app.on_window_close`` callbacks."""
        self.late_callbacks: CloseCallbacks = late_callbacks or {}
        """Per windowed table, its ``@app.on_late`` callbacks (else late records are dead letters)."""
        self.output = output
        self.outbox = Outbox()
        self.ctx = Context(self.outbox)
        self.binder = TableBinder(tables, _Clock(self.ctx))
        self.failure_alarm_after = failure_alarm_after
        self.handled = 0
        self.applied: Counter[str] = Counter()
        """Records handed to the handlers, per input topic (rebuilt ones too; those a
        handler failed on are among the dead letters as well)."""
        self.handler_batches = Durations()
        """Time in the handlers per partition batch."""
        self.consecutive_failures = 0
        self._last_alarm = 0.0
        self.run_budget = RUN_BUDGET
        """Seconds a key-concurrent route runs per call (a test driver: until none is queued,
        so that where the wall clock cuts a run does not change what runs beside what)."""
        self._turn = time.perf_counter()
        """When the event loop last took a turn in a batch (``TURN_AFTER``)."""

    async def apply(self, route: Route, admitted: Admitted) -> None:
        """Apply one partition batch: the rebuilt records without output, then the
        delivered ones, then report the late ones."""
        if admitted.rebuild or admitted.deliver:
            started = time.perf_counter()
            proc = route.proc
            self.binder.bind(proc.backends)
            self.ctx.processor = proc.id
            if admitted.rebuild:
                self.outbox.suppress = True
                try:
                    await self._run(admitted.rebuild, route, rebuilding=True)
                finally:
                    self.outbox.suppress = False
                if proc.window_states:  # closes the group made already: recorded, not called again
                    await fire_closes(proc, self.close_callbacks, self.outbox, silent=True)
            if admitted.deliver and proc.sides is not None:  # a shrink's merged processor goes live
                _go_live(proc)  # (at the latest: Task.go_live_if_caught_up may come first)
                if proc.sides.may_merge(drained=False):
                    _merge_sides(proc, "the key set behind reached the other's time")
            if admitted.deliver and route.scheduler is not None:
                if proc.windows:  # stream time in offset order, whatever order the keys run in
                    for rec in admitted.deliver:
                        proc.stream_at[(rec.topic, rec.partition, rec.offset)] = proc.advance(rec.timestamp, rec.key)
                route.scheduler.submit(admitted.deliver)
                await self.run_queued(route)
            elif admitted.deliver:
                await self._run(admitted.deliver, route, rebuilding=False)
                if proc.window_states:
                    await fire_closes(proc, self.close_callbacks, self.outbox, silent=False)
            self.handler_batches.observe(time.perf_counter() - started)
            self.applied[route.position_key[0]] += len(admitted.rebuild) + len(admitted.deliver)
        for rec, report in admitted.late:
            await self.output.dead_letter(rec, "ordering-violation", orjson.dumps(report).decode())
        for rec, reason, why in admitted.rejected:
            await self.output.dead_letter(rec, reason, why)
        if admitted.strays:
            policy = route.handlers[0].topic.strays
            for rec in admitted.strays:
                await self.output.stray(rec, policy)
        self.handled += admitted.consumed

    async def run_queued(self, route: Route) -> None:
        """Run a key-concurrent route's queued records for a while (``keyorder``); returns
        with none running, the others still queued and pending."""
        scheduler = route.scheduler
        assert scheduler is not None
        proc, kl, vl = route.proc, route.key_loads, route.value_loads
        self.binder.bind(proc.backends)
        failures: list[Failure] = []
        ran = 0

        async def handle(rec: Any) -> None:
            nonlocal ran
            ran += 1
            try:
                k = kl(rec.key) if rec.key is not None and kl is not None else rec.key
                v = vl(rec.value) if rec.value is not None and vl is not None else rec.value
            except Exception as exc:  # noqa: BLE001 - any decode error is a dead letter
                failures.append((rec, _decode_reason(rec, kl), exc, ""))
                proc.stream_at.pop((rec.topic, rec.partition, rec.offset), None)  # (it holds closes back)
                return
            ctx = Context(self.outbox)  # one per record: handlers of other keys run meanwhile
            ctx._rec, ctx.processor = rec, proc.id
            at = (rec.topic, rec.partition, rec.offset)
            ctx.stream_time = proc.stream_at.get(at, -1)  # kept until it finishes: it holds closes back
            _RUNNING.set(ctx)  # this task's own: windowed tables read this record's time
            try:
                for spec in route.handlers:
                    try:
                        await spec.fn(k, v, ctx)
                    except LateRecordError as exc:
                        await self._late(exc, rec, k, v, ctx, spec.name, failures)
                    except Exception as exc:  # noqa: BLE001 - user code
                        failures.append((rec, "handler", exc, spec.name))
            finally:
                proc.stream_at.pop(at, None)

        await scheduler.run(handle, self.run_budget)
        if failures:
            await self._failed(failures, ran * len(route.handlers), rebuilding=False)
        elif ran:
            self.consecutive_failures = 0
        if proc.window_states:
            await fire_closes(proc, self.close_callbacks, self.outbox, silent=False)

    async def _late(
        self, exc: LateRecordError, rec: Any, key: Any, value: Any, ctx: Context, handler: str, failures: list[Failure]
    ) -> None:
        """A record for closed windows: the table's ``on_late`` callbacks, else a dead letter."""
        fns = self.late_callbacks.get(exc.table)
        if not fns:
            failures.append((rec, "late", exc, handler))
            return
        for fn in fns:
            try:
                result = fn(key, value, ctx, exc)
                if inspect.isawaitable(result):
                    await result
            except Exception as err:  # noqa: BLE001 - user code
                failures.append((rec, "handler", err, getattr(fn, "__qualname__", repr(fn))))

    async def adopt_stream_time(self, proc: ProcessorState, stream_time: int) -> int:
        """A processor that takes keys over at T1 from their old owner goes on with the old
        owner's stream time there (a record late for the old owner is late for it too), and
        records as closed, without calling the callbacks, the windows that stream time had
        closed: the old owner sent them. Returns how many."""
        if not proc.window_states or stream_time <= proc.stream_time:
            return 0
        proc.stream_time = stream_time
        return await fire_closes(proc, self.close_callbacks, self.outbox, silent=True)

    async def go_live(self, proc: ProcessorState, *, drained: bool) -> int:
        """A shrink's merged processor (its store's two key sets on their own stream times,
        ``sides``) goes live once it has rebuilt every record the group handled already (the
        member says when): the closes due on each key set's time are sent from now on, and
        once the times may become one (``SideClocks.may_merge``; ``drained``: none of its
        partitions has records left that a fetch has seen) the larger is the processor's.
        Without this it would go live only at its first delivered record (:meth:`apply`),
        which may never come: the retired sharer may have handled the partition's last
        records. Returns how many closed."""
        if proc.sides is None:
            return 0
        _go_live(proc)
        if proc.sides.may_merge(drained=drained):
            _merge_sides(proc, "every partition read" if drained else "the key set behind reached the other's time")
        if not proc.window_states:
            return 0
        self.binder.bind(proc.backends)
        self.ctx.processor = proc.id
        closed = await fire_closes(proc, self.close_callbacks, self.outbox, silent=False)
        await self.send_output()
        return closed

    async def tick_wall(self, processors: Iterable[ProcessorState], now_ms: int) -> int:
        """``close_on="wall"``: move each processor's stream time up to ``now_ms`` (the wall
        clock less the allowance) and fire the closes that makes due. Returns how many."""
        closed = 0
        for proc in processors:
            if not proc.window_states or now_ms <= proc.stream_time:
                continue
            proc.stream_time = now_ms
            self.binder.bind(proc.backends)
            closed += await fire_closes(proc, self.close_callbacks, self.outbox, silent=False)
        return closed

    async def send_output(self) -> None:
        """Hand what the handlers sent to the producer (acknowledged at the checkpoint)."""
        if self.outbox.items:
            items, self.outbox.items = self.outbox.items, []
            for topic, key, value, headers, pid in items:
                await self.output.send(topic, key, value, headers, pid)
        if self.outbox.rows:
            rows, self.outbox.rows = self.outbox.rows, []
            self.output.write_rows(rows)

    async def fire(self, callbacks: list[Callable[..., Any]], partitions: Mapping[ProcessorState, list[Any]]) -> None:
        """Call each key callback once per processor with that processor's partitions,
        its tables bound."""
        if not callbacks:
            return
        for proc, parts in partitions.items():
            if not parts:
                continue
            self.binder.bind(proc.backends)
            for fn in callbacks:
                result = fn(parts)
                if inspect.isawaitable(result):
                    await result

    async def _run(self, records: list[Any], route: Route, rebuilding: bool) -> None:
        kl, vl, ctx = route.key_loads, route.value_loads, self.ctx
        failures: list[Failure] = []
        proc = route.proc
        # stream time with each record (windows): fixed once, in offset order, for every handler
        times = [proc.advance(rec.timestamp, rec.key) for rec in records] if proc.windows else None
        ctx.stream_time = -1
        if time.perf_counter() - self._turn > TURN_AFTER:  # (a merge applies runs of a few records)
            await self._take_turn()
        for spec in route.handlers:
            fn, is_async = spec.fn, spec.is_async
            for j, rec in enumerate(records):
                if j & TURN_CHECK == TURN_CHECK and time.perf_counter() - self._turn > TURN_AFTER:
                    await self._take_turn()
                if times is not None:
                    ctx.stream_time = times[j]
                try:
                    k = rec.key
                    if k is not None and kl is not None:
                        k = kl(k)
                    v = rec.value
                    if v is not None and vl is not None:
                        v = vl(v)
                except Exception as exc:  # noqa: BLE001 - any decode error is a dead letter
                    failures.append((rec, _decode_reason(rec, kl), exc, ""))
                    continue
                ctx._rec = rec
                try:
                    result = fn(k, v, ctx)
                    if is_async:
                        await result
                except LateRecordError as exc:
                    if rebuilding:  # reported (or handed to on_late) when first handled
                        failures.append((rec, "late", exc, spec.name))
                    else:
                        await self._late(exc, rec, k, v, ctx, spec.name, failures)
                except Exception as exc:  # noqa: BLE001 - user code
                    failures.append((rec, "handler", exc, spec.name))
        if failures:
            await self._failed(failures, len(records) * len(route.handlers), rebuilding)
        else:
            self.consecutive_failures = 0

    async def _take_turn(self) -> None:
        """Let the event loop run the other tasks once (``TURN_AFTER``): a pause on the
        clock, not ``sleep(0)``, which would run this task again before the timers that
        came due meanwhile (a heartbeat waits on one)."""
        await asyncio.sleep(TURN_PAUSE)
        self._turn = time.perf_counter()

    async def _failed(self, failures: list[Failure], attempts: int, rebuilding: bool) -> None:
        if not rebuilding:  # a rebuilt record's dead letter was sent when it was first handled
            seen: set[tuple[int, str]] = set()
            for rec, reason, exc, handler in failures:
                if reason != "handler" and (rec.offset, reason) in seen:
                    continue  # a decode failure is reported once, not once per handler
                seen.add((rec.offset, reason))
                await self.output.dead_letter(rec, reason, exc, handler)
        if len(failures) == attempts:
            self.consecutive_failures += attempts
        else:
            self.consecutive_failures = 0
        now = time.monotonic()
        if self.consecutive_failures >= self.failure_alarm_after and now - self._last_alarm > 10:
            self._last_alarm = now
            rec, reason, exc, handler = failures[-1]
            log.error(
                "%s: the last %d records all failed (%s in %s at %s[%d]@%d: %s: %s); they go to "
                "%s, but the job is not doing useful work",
                self.name,
                self.consecutive_failures,
                reason,
                handler or "decoding",
                rec.topic,
                rec.partition,
                rec.offset,
                type(exc).__name__,
                exc,
                self.output.dead_letter_topic,
            )


def by_processor(routes: Iterable[tuple[Any, Route]], only: set[Any] | None = None) -> dict[ProcessorState, list[Any]]:
    """Partitions grouped by the processor they route to (those in `only`, if given)."""
    out: dict[ProcessorState, list[Any]] = {}
    for tp, route in routes:
        if only is None or tp in only:
            out.setdefault(route.proc, []).append(tp)
    return out


def _decode_reason(rec: Any, key_loads: Callable[[bytes], Any] | None) -> str:
    if rec.key is not None and key_loads is not None:
        try:
            key_loads(rec.key)
        except Exception:  # noqa: BLE001
            return "key-decode"
    return "value-decode"


def _go_live(proc: ProcessorState) -> None:
    assert proc.sides is not None
    if proc.sides.go_live():
        log.info("processor %d goes live, its key sets on their own stream times %s", proc.id, proc.sides.times)


def _merge_sides(proc: ProcessorState, why: str) -> None:
    assert proc.sides is not None
    log.info("processor %d: its key sets' stream times %s become one (%s)", proc.id, proc.sides.times, why)
    proc.merge_sides()
