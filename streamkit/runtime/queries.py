"""The runtime's answers to queries of state by key (served by ``streamkit.ops.queries``).

The key's processor comes from the job's placement (linear hashing of the key's bytes
over the job's initial processor count, as its records are placed). The worker whose
member hosts that processor as an active one answers from the processor's table: the
value as of the last record it applied (read-your-processing), with the processor's
input positions. A worker that does not host it forwards the query to the one whose
latest heartbeat says it does; when no live worker does (a rebalance or a handover
under way), or the forwarded-to worker does not either, the answer is 503 with a retry
hint: never a copy a retired owner kept. A key whose processor runs on a worker that
answers no queries (started without a query port) is refused at once (502), saying so.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from streamkit.app import App
from streamkit.kafkaio import KafkaIO
from streamkit.ops.queries import Answer, ask, client_tls
from streamkit.runtime.jobmeta import JobWatcher
from streamkit.runtime.member import GroupMember
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.status import STALE_AFTER, STATUS_TOPIC, WorkerStatus, decode_status
from streamkit.windows import BookTable, Count, Session

__all__ = ["QueryAnswers"]

STATUS_TTL = 1.0
"""Seconds the workers' heartbeats, read to find a key's worker, are used for."""
RETRY_AFTER = 1.0
LOCK_WAIT = 2.0
"""Seconds a query waits for the batch under way to end (then: 503, ask again)."""


class QueryAnswers:
    """``lookup(table, key, forwarded)`` for one worker (``streamkit.ops.queries.Lookup``)."""

    def __init__(
        self, app: App, members: Callable[[], Sequence[GroupMember]], jobs: JobWatcher, io: KafkaIO, worker: str
    ) -> None:
        self.app, self.members, self.jobs, self.io, self.worker = app, members, jobs, io, worker
        self._seen: dict[str, WorkerStatus] = {}
        """Per worker, its newest heartbeat read so far."""
        self._next: dict[int, int] = {}
        """Per partition of the status topic, the next offset to read."""
        self._read_at = 0.0
        self._reading = asyncio.Lock()
        settings = app.settings
        self._token = settings.query_token.get_secret_value() if settings.query_token else None
        """Sent with a forwarded query (every worker of the job has the same one)."""
        self._tls = client_tls(settings.query_tls_cafile)
        """What another worker's HTTPS query certificate is checked with."""

    async def __call__(self, table: str, key_text: str, forwarded: bool, windows: bool = False) -> Answer:
        t = self.app.tables.get(table)
        if t is None or isinstance(t, BookTable):
            return Answer(
                404, {"error": f"app {self.app.name!r} has no table {table!r} (tables: {sorted(self.app.tables)})"}
            )
        if (t.window is not None) != windows:
            where = f"/tables/{table}/KEY" + ("/windows" if t.window is not None else "")
            kind = "windowed" if t.window is not None else "not windowed"
            return Answer(400, {"error": f"table {table!r} is {kind}: ask {where}"})
        try:
            key = t.key_serde.loads(key_text.encode())
            key_bytes = t.key_serde.dumps(key)
        except Exception as exc:  # noqa: BLE001 - a key its serde refuses
            return Answer(400, {"error": f"key {key_text!r} is not a key of table {table!r}: {exc}"})
        job, h = self.jobs.job, key_hash(key_bytes)
        members = self.members()
        # between batches: a batch of slow handlers lets the event loop take turns (this
        # answer among them), and its records are in the values before the positions
        lock = members[0].services.lock if members else None
        if lock is not None:
            try:
                async with asyncio.timeout(LOCK_WAIT):
                    await lock.acquire()
            except TimeoutError:  # a rebalance's catch-up or a long batch: ask again
                return Answer(503, {"error": f"worker {self.worker} is busy (a batch or a rebalance)"}, RETRY_AFTER)
        try:
            for member in members:  # by the count its processors hold their keys for (the job record may be ahead)
                task = member.tasks.active.get(lh_bucket(h, job.p0, member.job_p)) if member.job_p > 0 else None
                proc = task.proc if task is not None else None
                if proc is not None:  # a joining processor's store is not among them until its handover
                    answer: dict[str, Any] = {"table": table, "key": key_text}
                    if windows:
                        answer["windows"] = _windows(proc, table, key, key_bytes, t.window)
                        answer["stream_time"] = proc.stream_time
                    else:
                        value = proc.caches[table].get(key)
                        answer.update(value=_json(value), found=value is not None)
                    applied, _ = proc.stable()  # (a record its merge or a handler still holds is not in the value)
                    answer.update(processor=proc.id, worker=self.worker,
                                  positions={f"{t_}/{p}": o for (t_, p), o in sorted(applied.items())})  # fmt: skip
                    return Answer(200, answer)
        finally:
            if lock is not None:
                lock.release()
        pid = lh_bucket(h, job.p0, job.p)
        busy = Answer(503, {"error": f"processor {pid} of key {key_text!r} is not hosted by a live worker now"},
                      RETRY_AFTER)  # fmt: skip
        if forwarded:
            return busy
        claimants = [s for s in await self._live() if pid in s.processors and s.worker != self.worker]
        for status in claimants:
            if status.query_url:
                quoted = urllib.parse.quote(key_text, safe="")
                path = f"/tables/{urllib.parse.quote(table)}/{quoted}" + ("/windows" if windows else "")
                try:
                    return await ask(status.query_url + path, forwarded=True, token=self._token, ssl_context=self._tls)
                except Exception:  # noqa: BLE001 - that worker is gone or busy: the client asks again
                    return busy
        if claimants:  # hosted, but by workers that serve no queries: asking again will not help
            names = ", ".join(sorted(s.worker for s in claimants))
            why = "answers no queries: start every worker with --query-port (or STREAMKIT_QUERY_PORT)"
            return Answer(502, {"error": f"processor {pid} of key {key_text!r} runs on worker {names}, which {why}"})
        return busy

    async def _live(self) -> list[WorkerStatus]:
        """The live workers' newest heartbeats, read on from where the last look ended (at
        most once per ``STATUS_TTL``, one look at a time): the status topic keeps days of
        heartbeats, and reading them all would hold the worker's loop for seconds."""
        async with self._reading:
            if time.monotonic() - self._read_at > STATUS_TTL:
                await self._read_more()
                self._read_at = time.monotonic()
        return [s for s in self._seen.values() if s.alive and not s.stale]

    async def _read_more(self) -> None:
        for partition in range((await self.io.partition_count(STATUS_TOPIC)) or 0):
            start = self._next.get(partition)
            if start is None:  # a live worker beat within the last STALE_AFTER seconds: start a minute back
                end = await self.io.high_watermark(STATUS_TOPIC, partition)
                since = int((time.time() - 4 * STALE_AFTER) * 1000)
                start = await self.io.first_offset_at_or_after(STATUS_TOPIC, partition, since, end)
            records, self._next[partition] = await self.io.read(STATUS_TOPIC, partition, start)
            for rec in records:
                if (status := decode_status(rec.value, self.app.name, rec=rec)) is not None:
                    self._seen[status.worker] = status


def _windows(proc: ProcessorState, table: str, key: Any, key_bytes: bytes, window: Any) -> list[dict[str, Any]]:
    """Every window the processor holds for the key (its store and uncommitted changes)
    and has not expired, by start (``WindowState.windows``; a session's end is its last
    record's time, a count window's the number of its records' end)."""
    state = proc.window_states[table]
    found = state.windows(key, key_bytes)
    if proc.stream_time >= 0 and not isinstance(window, Count | Session):
        found = [(w, v) for w, v in found if not window.expired(w.start, proc.stream_time)]
    return [{"start": w.start, "end": w.end, "value": _json(v)} for w, v in found]


def _json(value: Any) -> Any:
    """A table's value as JSON can carry it (bytes as text)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "backslashreplace")
    return value
