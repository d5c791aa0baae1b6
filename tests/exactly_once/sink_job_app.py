"""An exactly-once job that writes a sink row (insert or append; padded with ``SK_PAD`` characters)
and sends an output per record, checkpointing every ``SK_COMMIT`` seconds (1), in a
worker that can be stopped at one chosen instant of a checkpoint, when a file exists:

- ``SK_KILL_FLAG``: SIGKILL at step 3 of its next checkpoint that moved positions (its
  store, changelog, markers and sink rows written; its positions not yet in the progress
  log);
- ``SK_PAUSE_FLAG``: SIGSTOP (every thread, heartbeats too, as a long pause of the process
  or its machine) at its next checkpoint that writes, right after the checkpoint's zombie
  check and before its store commit; its pid goes into ``SK_PAUSED`` first.

Only the instant is chosen here; the crash or the pause is a real one, and what follows
(a SIGCONT from the test) is the runtime's own code."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import streamkit
import streamkit.runtime.checkpointing as checkpointing
from streamkit.runtime.progress import ProgressLog
from streamkit.sinks.delta import DeltaSink
from streamkit.sinks.postgres import PostgresSink

app = streamkit.App(
    os.environ["SK_TEST_APP"], processing="exactly_once", commit_interval=float(os.environ.get("SK_COMMIT", "1.0"))
)
source = app.topic(os.environ["SK_TEST_TOPIC"])
out = app.topic(os.environ["SK_OUT"])
seen = app.table("seen", default=int)
rows = app.sink(  # a Delta table at SK_DELTA, else the PostgreSQL table SK_PG_TABLE
    "rows",
    DeltaSink(os.environ["SK_DELTA"])
    if os.environ.get("SK_DELTA")
    else PostgresSink(os.environ["SK_PG"], os.environ["SK_PG_TABLE"]),
)
PAD = int(os.environ.get("SK_PAD", "0"))


@app.processor(source)
def handle(key: str, value: Any, ctx: streamkit.Context) -> None:
    seen[key] += 1
    ctx.write(rows, {"id": value["i"], "k": key} | ({"pad": "x" * PAD} if PAD else {}))
    ctx.send(out, key, value)


def _flagged(name: str) -> bool:
    """Whether the flag file ``name`` names exists (it is taken away: once)."""
    flag = os.environ.get(name, "")
    if flag and os.path.exists(flag):
        os.remove(flag)
        return True
    return False


_record = ProgressLog.record
_commit_stores = checkpointing.log_and_commit_stores


async def _record_or_die(self: ProgressLog, *args: Any, **kwargs: Any) -> Any:
    commit = args[-1] if args else kwargs["commit"]
    if any(v is not None for v in commit.parts.values()) and _flagged("SK_KILL_FLAG"):
        os.kill(os.getpid(), signal.SIGKILL)
    return await _record(self, *args, **kwargs)


async def _pause_then_commit(writes: Any, changelog: Any) -> Any:
    if writes and _flagged("SK_PAUSE_FLAG"):
        Path(os.environ["SK_PAUSED"]).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
    return await _commit_stores(writes, changelog)


ProgressLog.record = _record_or_die  # type: ignore[method-assign]
checkpointing.log_and_commit_stores = _pause_then_commit
