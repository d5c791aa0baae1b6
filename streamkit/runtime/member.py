"""A group member: one consumer that hosts zero or more processors.

The hot loop lives here (`_run_records`): decode, bind, call the handler, count. It is
written for throughput: the context object is reused, tables are bound once per
partition batch, positions are updated once per batch, and output is sent in bulk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from stores.serde import JsonSerde, Serde, SerdeError

from assignors.group import MemberInfo, StreamkitAssignor
from streamkit.app import App, HandlerSpec
from streamkit.context import Context, Outbox
from streamkit.runtime import checkpointing
from streamkit.runtime.output import Output
from streamkit.runtime.processor import ProcessorState

if TYPE_CHECKING:
    from streamkit.runtime.worker import Worker

log = logging.getLogger(__name__)


def _decoder(serde: Serde) -> Callable[[bytes], Any]:
    """The fastest callable that decodes like `serde.loads` (orjson's C function for JSON)."""
    if type(serde) is JsonSerde:
        return orjson.loads
    return serde.loads


@dataclass
class Route:
    """Where records of one assigned partition go."""

    proc: ProcessorState
    handlers: list[HandlerSpec]
    key_loads: Callable[[bytes], Any]
    value_loads: Callable[[bytes], Any]
    position_key: tuple[str, int]
    rebuild_until: int  # offsets below this were already handled by the group: emit nothing
    committed: int  # the group's committed offset as last known


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, member: "GroupMember") -> None:
        self.member = member

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.member.release_all()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self.member.take_assignment()


class GroupMember:
    def __init__(self, worker: "Worker", index: int) -> None:
        self.worker = worker
        self.app: App = worker.app
        self.name = f"{worker.client_id}-m{index}"
        self.output: Output = worker.output
        self.processors: dict[int, ProcessorState] = {}
        self.routes: dict[TopicPartition, Route] = {}
        self.layout_epochs: dict[str, int] = {}
        self.outbox = Outbox()
        self.ctx = Context(self.outbox)
        self.handled = 0
        self.consecutive_failures = 0
        self._last_alarm = 0.0
        self._since_checkpoint = 0
        self._next_checkpoint = 0.0
        self._stopping = False
        s = self.app.settings
        self.assignor = StreamkitAssignor(MemberInfo(p0=worker.p0, p=worker.p0))
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=worker.bootstrap,
            group_id=self.app.group_id,
            client_id=self.name,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            partition_assignment_strategy=(self.assignor,),
            session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            max_poll_interval_ms=s.max_poll_interval_ms,
            fetch_max_bytes=s.fetch_max_bytes,
            max_partition_fetch_bytes=s.max_partition_fetch_bytes,
        )

    @property
    def generation(self) -> int:
        coordinator = self.consumer._coordinator
        return coordinator.generation if coordinator is not None else -1

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.subscribe(self.app.input_topics, listener=_Listener(self))

    # -- rebalances -----------------------------------------------------------------------
    async def release_all(self) -> None:
        """Partitions are being taken away: flush callbacks, checkpoint, commit, close stores."""
        async with self.worker.lock:
            if not self.processors:
                return
            await self._fire(self.app.keys_revoked_callbacks)
            await checkpointing.checkpoint(self)
            for proc in self.processors.values():
                proc.close()
            self.processors.clear()
            self.routes.clear()

    async def take_assignment(self) -> None:
        """Open the stores of our processors and seek each partition to its checkpoint."""
        async with self.worker.lock:
            assignment = self.assignor.assignment
            if assignment is None or self._stopping:
                return
            self.layout_epochs = dict(assignment.epochs)
            tps = [TopicPartition(t, p) for slots in assignment.processors.values() for t, p, _ in slots]
            committed = {tp: await self.consumer.committed(tp) for tp in tps}
            state_dir = self.app.settings.state_dir
            for pid, slots in sorted(assignment.processors.items()):
                proc = await ProcessorState.open(
                    self.app, pid, state_dir, self.app.settings.store_open_timeout
                )
                self.processors[pid] = proc
                for topic, part, key_filter in slots:
                    if key_filter is not None:
                        raise NotImplementedError(
                            f"processor {pid} shares {topic}[{part}] by key range; shared tasks "
                            "need more partitions than processors today"
                        )
                    tp = TopicPartition(topic, part)
                    pos = proc.positions.setdefault((topic, part), 0)
                    group_pos = committed.get(tp) or 0
                    handlers = self.app.handlers[topic]
                    t = handlers[0].topic
                    self.routes[tp] = Route(
                        proc, handlers, _decoder(t.key_serde), _decoder(t.value_serde),
                        (topic, part), max(pos, group_pos), group_pos,
                    )
                    self.consumer.seek(tp, pos)
                    if group_pos > pos:
                        log.info("%s: processor %d rebuilds %s from %d to %d without output",
                                 self.name, pid, tp, pos, group_pos)
            self._next_checkpoint = time.monotonic() + self.app.settings.commit_interval
            await self._fire(self.app.keys_assigned_callbacks)
            self.worker.beat()
            log.info("%s: hosts processors %s (generation %d): %s", self.name,
                     sorted(self.processors), self.generation, sorted(self.routes))

    async def _fire(self, callbacks: list[Callable[..., Any]]) -> None:
        if not callbacks:
            return
        for proc in self.processors.values():
            parts = [tp for tp, r in self.routes.items() if r.proc is proc]
            proc.bind()
            for fn in callbacks:
                result = fn(parts)
                if asyncio.iscoroutine(result):
                    await result

    # -- the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        consumer = self.consumer
        settings = self.app.settings
        while not self._stopping:
            batch = await consumer.getmany(timeout_ms=200)
            if batch:
                async with self.worker.lock:
                    await self._handle(batch)
            if self.processors and (
                self._since_checkpoint >= settings.commit_every
                or time.monotonic() >= self._next_checkpoint
            ):
                async with self.worker.lock:
                    await checkpointing.checkpoint(self)
                self.worker.beat()
                self._since_checkpoint = 0
                self._next_checkpoint = time.monotonic() + settings.commit_interval

    async def _handle(self, batch: dict[TopicPartition, list[Any]]) -> None:
        self.app.clock.ctx = self.ctx
        for tp, records in batch.items():
            route = self.routes.get(tp)
            if route is None or not records:
                continue  # fetched before a rebalance took the partition away
            proc = route.proc
            pos = proc.positions[route.position_key]
            last = records[-1].offset
            if records[0].offset < pos:
                records = [r for r in records if r.offset >= pos]
                if not records:
                    continue
            proc.bind()
            self.ctx.processor = proc.id
            if records[0].offset < route.rebuild_until:
                replay = [r for r in records if r.offset < route.rebuild_until]
                records = records[len(replay):]
                self.outbox.suppress = True
                await self._run_records(replay, route, rebuilding=True)
                self.outbox.suppress = False
            if records:
                await self._run_records(records, route, rebuilding=False)
            proc.positions[route.position_key] = last + 1
            n = len(batch[tp])
            proc.uncommitted += n
            self._since_checkpoint += n
            self.handled += n
        if self.outbox.items:
            items, self.outbox.items = self.outbox.items, []
            for topic, key, value, headers in items:
                await self.output.send(topic, key, value, headers)

    async def _run_records(self, records: list[Any], route: Route, rebuilding: bool) -> None:
        kl, vl, ctx = route.key_loads, route.value_loads, self.ctx
        failures: list[tuple[Any, str, BaseException, str]] = []
        for spec in route.handlers:
            fn = spec.fn
            if spec.is_async:
                for rec in records:
                    try:
                        k = rec.key
                        if k is not None:
                            k = kl(k)
                        v = rec.value
                        if v is not None:
                            v = vl(v)
                    except Exception as exc:  # noqa: BLE001 - any decode error is a dead letter
                        failures.append((rec, _decode_reason(rec, kl, exc), exc, ""))
                        continue
                    ctx._rec = rec
                    try:
                        await fn(k, v, ctx)
                    except Exception as exc:  # noqa: BLE001 - user code
                        failures.append((rec, "handler", exc, spec.name))
            else:
                for rec in records:
                    try:
                        k = rec.key
                        if k is not None:
                            k = kl(k)
                        v = rec.value
                        if v is not None:
                            v = vl(v)
                    except Exception as exc:  # noqa: BLE001
                        failures.append((rec, _decode_reason(rec, kl, exc), exc, ""))
                        continue
                    ctx._rec = rec
                    try:
                        fn(k, v, ctx)
                    except Exception as exc:  # noqa: BLE001
                        failures.append((rec, "handler", exc, spec.name))
        if failures:
            await self._failed(failures, len(records) * len(route.handlers), rebuilding)
        else:
            self.consecutive_failures = 0

    async def _failed(
        self, failures: list[tuple[Any, str, BaseException, str]], attempts: int, rebuilding: bool
    ) -> None:
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
        threshold = self.app.settings.failure_alarm_after
        now = time.monotonic()
        if self.consecutive_failures >= threshold and now - self._last_alarm > 10:
            self._last_alarm = now
            rec, reason, exc, handler = failures[-1]
            log.error(
                "%s: the last %d records all failed (%s in %s at %s[%d]@%d: %s: %s); they go to "
                "%s, but the job is not doing useful work",
                self.name, self.consecutive_failures, reason, handler or "decoding", rec.topic,
                rec.partition, rec.offset, type(exc).__name__, exc, self.app.dead_letter_topic,
            )

    def request_stop(self) -> None:
        """Leave the loop after the current batch."""
        self._stopping = True

    async def stop(self, checkpoint: bool = True) -> None:
        """Checkpoint (unless told not to: after a failure mid-batch), close stores, leave."""
        async with self.worker.lock:
            self._stopping = True
            if self.processors and checkpoint:
                await self._fire(self.app.keys_revoked_callbacks)
                await checkpointing.checkpoint(self)
            for proc in self.processors.values():
                proc.close()
            self.processors.clear()
            self.routes.clear()
        await self.consumer.stop()


def _decode_reason(rec: Any, key_loads: Callable[[bytes], Any], exc: BaseException) -> str:
    if rec.key is not None:
        try:
            key_loads(rec.key)
        except Exception:  # noqa: BLE001
            return "key-decode"
    return "value-decode"
