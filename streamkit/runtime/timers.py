"""`@app.every` timers: `fn()` once per worker, or `fn(ctx)` once per hosted processor.

A per-processor timer runs with that processor's tables bound and may send output
(`ctx.send`, no source header: there is no input record). Windowed tables address the
window of the current wall-clock time.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from streamkit.app import TimerSpec
from streamkit.context import Context, Outbox
from streamkit.runtime.binding import TableBinder
from streamkit.runtime.output import Output
from streamkit.runtime.processor import ProcessorState
from streamkit.tables import Table

log = logging.getLogger(__name__)


class TimerContext(Context):
    """Context of a per-processor timer: no input record; `send` adds no source header."""

    __slots__ = ("_now",)

    def __init__(self, outbox: Outbox, processor: int, now: Callable[[], float] = time.time) -> None:
        super().__init__(outbox)
        self.processor = processor
        self._now = now

    @property
    def timestamp(self) -> int:
        """Now, in ms since the epoch (a timer has no record)."""
        return int(self._now() * 1000)

    def send(self, topic: Any, key: Any, value: Any, headers: Any = ()) -> None:
        self._outbox.add(topic, key, value, list(headers), self.processor)


async def run_timer(
    spec: TimerSpec,
    *,
    processors: Callable[[], Iterable[ProcessorState]],
    tables: Mapping[str, Table],
    output: Output,
    lock: asyncio.Lock,
) -> None:
    """Fire `spec` every `spec.seconds` until cancelled; a failure is logged, not raised.

    `processors()`: the processors hosted at the time of firing."""
    while True:
        await asyncio.sleep(spec.seconds)
        async with lock:
            try:
                await fire(spec, processors(), tables, output)
            except Exception:  # noqa: BLE001 - a failing timer must not stop the worker
                log.exception("timer %s failed", spec.fn.__qualname__)


async def fire(
    spec: TimerSpec,
    processors: Iterable[ProcessorState],
    tables: Mapping[str, Table],
    output: Output,
    now: Callable[[], float] = time.time,
) -> None:
    """Fire `spec` once: once for the worker, or once per processor in `processors`.
    ``now``: the wall clock in seconds (a test driver's own, which it moves by hand). One
    processor's failure does not keep the others' from firing: the first is raised after."""
    if not spec.per_processor:
        result = spec.fn()
        if inspect.isawaitable(result):
            await result
        return
    failed: Exception | None = None
    for proc in list(processors):
        outbox = Outbox()
        ctx = TimerContext(outbox, proc.id, now)
        ctx.stream_time = proc.close_bound()  # a window closed by then is late, never booked again
        TableBinder(tables, ctx).bind(proc.backends)
        try:
            result = spec.fn(ctx)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:  # noqa: BLE001 - said (raised) once every processor fired
            failed = failed or exc
            continue
        for topic, key, value, headers, pid in outbox.items:
            await output.send(topic, key, value, headers, pid)
        output.write_rows(outbox.rows)
    if failed is not None:
        raise failed
