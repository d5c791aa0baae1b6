"""The job of the processor scaling test: per key, per producer, count and last seq, and
one output record per input record (to the topic named by SK_TEST_OUT); per key and
second of record time, a count (a tumbling window, grace ``GRACE_S``), sent when the
window closes (to ``<out>-closes``; a record late for it to ``<out>-late``); the same
count in a window of every other kind with SK_TEST_WINDOWS=all (``OTHER_WINDOWS``; their
closes and late records name their table).

With SK_TEST_CONCURRENCY=N the handler is async and key-concurrent: it awaits 1 ms per
record, 200 ms for the slow keys k0..k3 (whose records queue up behind each other while
other keys' records finish: checkpoints then carry IC ranges). With SK_TEST_DELAY_MS=D
the handler takes D ms per record (a job that is slow to consume its backlog)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import streamkit
from streamkit.windows import Count, Hopping, LateRecordError, Session, Sliding, Tumbling, WindowKind

SLOW_KEYS = {"k0", "k1", "k2", "k3"}
GRACE_S = 3.0
OTHER_WINDOWS: dict[str, WindowKind] = {
    "hopping": Hopping(2, 1, grace=GRACE_S),
    # (a gap below a third of a second: the two producers of the scaling tests each send
    # a key every 2/3 s, in step, so the longest pause between a key's records is between
    # 1/3 and 2/3 s, as the producers' phase has it; with a 0.5 s gap, whether a session
    # ever ended was up to that phase, and on a quick machine none did)
    "session": Session(0.25, grace=GRACE_S),
    "sliding": Sliding(2, grace=GRACE_S),
    "count": Count(5),
}
log = logging.getLogger("scale_app")


def make_app(
    name: str, topic: str, out: str, concurrency: int = 1, delay_ms: float = 0.0, every_kind: bool = False
) -> streamkit.App:
    """``every_kind``: the windows of ``OTHER_WINDOWS`` too (they cost a scaling test seconds)."""
    app = streamkit.App(name, commit_interval=0.3)
    source = app.topic(topic)
    # key -> {producer: [count, last seq, disorder]}
    seen = app.table("seen", default=dict)
    per_second = app.table("per_second", default=int, window=Tumbling(1, grace=GRACE_S))

    others = {kind: app.table(kind, default=int, window=w) for kind, w in OTHER_WINDOWS.items() if every_kind}

    @app.on_window_close(per_second)
    def second_done(key: str, window: streamkit.Window, n: int, ctx: streamkit.Context) -> None:
        ctx.send(f"{out}-closes", key, {"start": window.start, "n": n, "processor": ctx.processor})

    def sender(kind: str) -> Any:
        def done(key: str, window: streamkit.Window, n: int, ctx: streamkit.Context) -> None:
            ctx.send(f"{out}-closes", key, {"table": kind, "start": window.start, "end": window.end, "n": n})

        return done

    for kind, table in others.items():
        app.on_window_close(table)(sender(kind))

    def apply(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        if delay_ms:
            time.sleep(delay_ms / 1000)
        state = seen[key]
        count, last, disorder = state.get(value["p"], (0, -1, 0))
        if value["seq"] <= last:  # what a failing order check shows (ScaleJob.verify)
            log.warning("disorder: %s/%s seq %d after %d, from %s[%d]@%d on processor %d", key, value["p"],
                        value["seq"], last, ctx.topic, ctx.partition, ctx.offset, ctx.processor)  # fmt: skip
        state[value["p"]] = [count + 1, value["seq"], disorder + (value["seq"] <= last)]
        seen[key] = state
        ctx.send(out, key, {"p": value["p"], "seq": value["seq"], "processor": ctx.processor})
        try:
            per_second[key] += 1
        except LateRecordError:
            ctx.send(f"{out}-late", key, {"p": value["p"], "seq": value["seq"]})
        for kind, table in others.items():
            try:
                if kind == "sliding":
                    table.add(key, 1)
                else:
                    table.update(key, lambda n: n + 1)
            except LateRecordError:
                ctx.send(f"{out}-late", key, {"table": kind, "p": value["p"], "seq": value["seq"]})

    if concurrency == 1:
        app.processor(source)(apply)
        return app

    @app.processor(source, concurrency=concurrency)
    async def track(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        await asyncio.sleep(0.2 if key in SLOW_KEYS else 0.001)
        apply(key, value, ctx)

    return app


app = make_app(
    os.environ.get("SK_TEST_APP", "scale"),
    os.environ.get("SK_TEST_TOPIC", "scale-input"),
    os.environ.get("SK_TEST_OUT", "scale-output"),
    int(os.environ.get("SK_TEST_CONCURRENCY", "1")),
    float(os.environ.get("SK_TEST_DELAY_MS", "0")),
    os.environ.get("SK_TEST_WINDOWS") == "all",
)
