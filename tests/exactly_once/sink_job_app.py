"""An exactly-once job that writes a sink row (insert; padded with ``SK_PAD`` characters)
and sends an output per record, in a worker that SIGKILLs itself at one chosen instant:
when the file ``SK_KILL_FLAG`` exists,
at step 3 of its next checkpoint that moved positions (its store, changelog, markers and
sink rows written; its positions not yet in the progress log). Only the instant is chosen
here; the crash is a real one."""

from __future__ import annotations

import os
import signal
from typing import Any

import streamkit
from streamkit.runtime.progress import ProgressLog
from streamkit.sinks.postgres import PostgresSink

app = streamkit.App(os.environ["SK_TEST_APP"], processing="exactly_once", commit_interval=1.0)
source = app.topic(os.environ["SK_TEST_TOPIC"])
out = app.topic(os.environ["SK_OUT"])
seen = app.table("seen", default=int)
rows = app.sink("rows", PostgresSink(os.environ["SK_PG"], os.environ["SK_PG_TABLE"]))
PAD = int(os.environ.get("SK_PAD", "0"))


@app.processor(source)
def handle(key: str, value: Any, ctx: streamkit.Context) -> None:
    seen[key] += 1
    ctx.write(rows, {"id": value["i"], "k": key} | ({"pad": "x" * PAD} if PAD else {}))
    ctx.send(out, key, value)


_record = ProgressLog.record


async def _record_or_die(self: ProgressLog, *args: Any, **kwargs: Any) -> Any:
    commit = args[-1] if args else kwargs["commit"]
    flag = os.environ.get("SK_KILL_FLAG", "")
    if flag and os.path.exists(flag) and any(v is not None for v in commit.parts.values()):
        os.remove(flag)
        os.kill(os.getpid(), signal.SIGKILL)
    return await _record(self, *args, **kwargs)


ProgressLog.record = _record_or_die  # type: ignore[method-assign]
