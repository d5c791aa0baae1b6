"""Worker heartbeats in `__streamkit_status`, and reading them back for `streamkit status`.

Every worker publishes, every few seconds, what it hosts and how it fares (dead letters
by reason, the current run of consecutive failures, the last error). The status command
reads the newest record of each worker; a worker that stopped cleanly says so, one that
died simply goes stale.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from streamkit.kafka import read_to_end

if TYPE_CHECKING:
    from streamkit.runtime.worker import Worker

STATUS_TOPIC = "__streamkit_status"
STALE_AFTER = 15.0


@dataclass
class WorkerStatus:
    app: str
    worker: str
    pid: int
    host: str
    at: float
    alive: bool
    processors: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    handled: int = 0
    dead_letters: dict[str, int] = field(default_factory=dict)
    consecutive_failures: int = 0
    last_error: str | None = None

    @property
    def stale(self) -> bool:
        return self.alive and time.time() - self.at > STALE_AFTER

    def encode(self) -> bytes:
        return orjson.dumps(self.__dict__, option=orjson.OPT_NON_STR_KEYS)


def snapshot(worker: "Worker", alive: bool = True) -> WorkerStatus:
    processors: dict[int, list[tuple[str, int]]] = {}
    handled = failures = 0
    for member in worker.members:
        handled += member.handled
        failures = max(failures, member.consecutive_failures)
        for tp, route in member.routes.items():
            processors.setdefault(route.proc.id, []).append((tp.topic, tp.partition))
    out = worker.output
    return WorkerStatus(
        app=worker.app.name, worker=worker.client_id, pid=os.getpid(), host=socket.gethostname(),
        at=time.time(), alive=alive, processors={k: sorted(v) for k, v in processors.items()},
        handled=handled, dead_letters=dict(out.dead_letter_counts),
        consecutive_failures=failures, last_error=out.last_error,
    )


async def read_statuses(bootstrap: str, app_name: str) -> list[WorkerStatus]:
    latest: dict[str, WorkerStatus] = {}
    for rec in await read_to_end(bootstrap, STATUS_TOPIC):
        d: dict[str, Any] = orjson.loads(rec.value)
        if d.get("app") != app_name:
            continue
        d["processors"] = {int(k): [tuple(x) for x in v] for k, v in d["processors"].items()}
        latest[d["worker"]] = WorkerStatus(**d)
    return sorted(latest.values(), key=lambda s: s.worker)
