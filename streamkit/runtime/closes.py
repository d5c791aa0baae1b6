"""Window closes: the close callbacks of the windows a processor's stream time closed.

``streamkit.windows.state`` knows which windows are due (their close time is at most
the processor's close bound); this module calls the app's ``@app.on_window_close``
callbacks for them and records each close in the state (the book), in the same
checkpoint as the records that moved stream time. While state is rebuilt (records the
group handled before, applied without output) the closes are recorded and no callback
runs: their output was sent when the records were first handled.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

from streamkit.context import Context, Header, Outbox
from streamkit.runtime.processor import ProcessorState
from streamkit.windows import Window

log = logging.getLogger(__name__)

CloseCallbacks = Mapping[str, list[Callable[..., Any]]]
_NOTHING: Any = object()


class CloseContext(Context):
    """The context of a close callback: no input record. ``timestamp`` is the window's
    end; output carries ``streamkit.source`` = ``close/TABLE/START`` (one per window, so
    a downstream consumer can drop the duplicates at-least-once output may bring)."""

    __slots__ = ("_source", "_end")

    def __init__(self, outbox: Outbox, processor: int, table: str, window: Window) -> None:
        super().__init__(outbox)
        self.processor = processor
        self._source = f"close/{table}/{window.start}".encode()
        self._end = window.end

    @property
    def timestamp(self) -> int:
        return self._end

    def send(self, topic: Any, key: Any, value: Any, headers: Any = ()) -> None:
        hdrs: list[Header] = [*headers, ("streamkit.source", self._source)]
        self._outbox.add(topic, key, value, hdrs, self.processor)


async def fire_closes(
    proc: ProcessorState, callbacks: CloseCallbacks, outbox: Outbox, *, silent: bool, bound: int | None = None
) -> int:
    """Close every window of ``proc`` due at ``bound`` (default: its close bound): call
    the callbacks (unless ``silent``) with the processor's tables bound (the caller binds
    them), then record the close. Returns how many closed. A callback that raises is
    logged; the window closes all the same (calling it again would not end otherwise)."""
    closed = 0
    for name, state in proc.window_states.items():
        state.forget_records()
        if state.book is None:
            continue
        nxt = state.next_close()
        if nxt is None or nxt > proc.stream_time:
            continue
        if bound is None:
            bound = proc.close_bound()
        if nxt > bound:
            continue
        fns = () if silent else callbacks.get(name, ())
        if proc.sides is None:
            due = state.due(bound)
        else:  # each key set's windows on its own stream time (``sides``)
            due = [
                found
                for side, at in sorted(proc.sides.times.items())
                for found in state.due(min(bound, at), accept=proc.sides.owns(side, name))
            ]
        for key, window in due:
            value = state.value_of(key, window, _NOTHING) if fns else _NOTHING
            if value is not _NOTHING:  # (a window only read, never written, has nothing to close)
                ctx = CloseContext(outbox, proc.id, name, window)
                for fn in fns:
                    try:
                        result = fn(key, window, value, ctx)
                        if inspect.isawaitable(result):
                            await result
                    except Exception:  # noqa: BLE001 - user code
                        log.exception(
                            "close callback %s of table %r failed for key %r, window %s",
                            getattr(fn, "__qualname__", fn), name, key, window,
                        )  # fmt: skip
            state.closed(key, window)
            closed += 1
    if proc.sides is None and proc.window_states:
        proc.fired_through = max(proc.fired_through, bound if bound is not None else proc.close_bound())
    proc.uncommitted += closed
    return closed
