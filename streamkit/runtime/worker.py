"""A worker process: K group members, the shared producer, timers and heartbeats."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import uuid
from typing import Any

from aiokafka import AIOKafkaProducer
from stores.tuning import relax_malloc_trim

from streamkit.app import App, TimerSpec
from streamkit.broker import EmbeddedBroker, wait_for_broker
from streamkit.context import Context, Outbox
from streamkit.errors import ConfigError
from streamkit.kafka import ensure_topic, input_partition_counts, start_admin
from streamkit.layout._kafka import KafkaIO
from streamkit.layout.model import TopicLayout
from streamkit.layout.registry import LayoutRegistry
from streamkit.producer import Producer
from streamkit.runtime.jobmeta import resolve_processor_count
from streamkit.runtime.progress import ProgressLog
from streamkit.runtime.member import GroupMember
from streamkit.runtime.output import Output
from streamkit.runtime.status import STATUS_TOPIC, snapshot

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 2.0


class Worker:
    def __init__(self, app: App, members: int = 1, bootstrap: str | None = None) -> None:
        if members < 1:
            raise ConfigError(f"a worker runs at least one processor, not {members}")
        self.app = app
        self.member_count = members
        self.bootstrap = bootstrap or app.settings.broker
        self.client_id = f"{app.name}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.lock = asyncio.Lock()  # one batch, rebalance step or timer at a time
        self.members: list[GroupMember] = []
        self.p0 = 0
        self._embedded: EmbeddedBroker | None = None
        self._stop = asyncio.Event()
        self._beat = asyncio.Event()
        self._producer: AIOKafkaProducer | None = None
        self._output_producer: Producer | None = None
        self.io: KafkaIO | None = None
        self.registry: LayoutRegistry = None  # type: ignore[assignment]  # set by prepare()
        self.progress: ProgressLog
        self.output: Output

    async def prepare(self) -> None:
        """Resolve the broker and the job (p0), check topics, start the producer."""
        relax_malloc_trim()  # checkpoints serialise many values at once: see stores.tuning
        if not self.app.handlers:
            raise ConfigError(f"app {self.app.name!r} has no @app.processor handler: nothing to run")
        if self.bootstrap is None:
            self._embedded = EmbeddedBroker()
            self.bootstrap = self._embedded.bootstrap
            log.warning("no broker given: started an embedded broker at %s", self.bootstrap)
        else:
            await asyncio.to_thread(wait_for_broker, self.bootstrap, 10.0)  # BrokerError: one line
        self.io = await KafkaIO(self.bootstrap, client_id=self.client_id).start()
        counts = await input_partition_counts(self.io, self.app.input_topics)
        admin = await start_admin(self.bootstrap)
        try:
            await ensure_topic(admin, self.app.dead_letter_topic, 1)
            await ensure_topic(admin, STATUS_TOPIC, 1)
        finally:
            await admin.close()
        self._producer = AIOKafkaProducer(  # internal records: heartbeats, progress
            bootstrap_servers=self.bootstrap, client_id=self.client_id, acks="all", linger_ms=0,
        )
        await self._producer.start()
        self.registry = LayoutRegistry(self.bootstrap, client_id=self.client_id, io=self.io)
        await self.registry.start()
        await self.registry.refresh()
        # a topic with a layout counts its initial and active partitions, not its physical ones
        initial, active = dict(counts), dict(counts)
        for topic in counts:
            if (layout := self.registry.get(topic)) is not None:
                initial[topic], active[topic] = layout.n0, layout.active
        self.p0 = await resolve_processor_count(
            self.bootstrap, self.app.name, self.app.settings.processors, initial[self.app.input_topics[0]]
        )
        too_few = {t: n for t, n in active.items() if n < self.p0}
        if too_few:
            raise ConfigError(
                f"job {self.app.name!r} has {self.p0} processors but topics {too_few} have fewer "
                "partitions; key-range shared tasks are not available yet: add partitions first"
            )
        self.registry.add_listener(self._on_layout_change)
        self.registry.watch(0.2)
        self.progress = ProgressLog(self.io, self._producer, self.app.group_id)
        await self.progress.start()
        self._output_producer = await Producer(self.bootstrap, client_id=self.client_id).start()
        self.output = Output(self.app, self._output_producer)

    def _on_layout_change(self, new: TopicLayout, old: TopicLayout | None) -> None:
        for member in self.members:
            member.on_layout_change(new, old)

    async def run(self) -> None:
        await self.prepare()
        self.members = [GroupMember(self, i) for i in range(self.member_count)]
        for m in self.members:
            await m.start()
        runs = [asyncio.create_task(m.run(), name=m.name) for m in self.members]
        aux = [asyncio.create_task(self._timer(t)) for t in self.app.timers]
        aux.append(asyncio.create_task(self._heartbeat()))
        stop = asyncio.create_task(self._stop.wait())
        failed: BaseException | None = None
        try:
            done, _ = await asyncio.wait([*runs, *aux, stop], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stop and not t.cancelled() and t.exception() is not None:
                    failed = t.exception()
        finally:
            for m in self.members:
                m.request_stop()
            for t in [*aux, stop]:
                t.cancel()
            for m, t in zip(self.members, runs):
                # never in the middle of a batch; but a member waiting for records may wait
                # for a whole rebalance (getmany waits for the new assignment): not for that
                if failed is not None or m.awaiting_records:
                    t.cancel()
            # the others leave their loop after their batch
            await asyncio.gather(*runs, *aux, stop, return_exceptions=True)
            await self.shutdown(clean=failed is None)
        if failed is not None:
            raise failed

    def stop(self) -> None:
        self._stop.set()

    async def shutdown(self, clean: bool = True) -> None:
        """Leave the group; checkpoint first unless a failure may have left a batch half done."""
        for m in self.members:
            try:
                await m.stop(checkpoint=clean)
            except Exception:  # noqa: BLE001 - keep stopping the others
                log.exception("%s: error while stopping", m.name)
        if self._output_producer is not None:
            await self._output_producer.stop()
        if self.registry is not None:
            await self.registry.stop()
        if self._producer is not None:
            try:
                await self._publish_status(alive=False)
            finally:
                await self._producer.stop()
        if self.io is not None:
            await self.io.close()
        if self._embedded is not None:
            self._embedded.stop()

    async def _publish_status(self, alive: bool = True) -> None:
        assert self._producer is not None
        status = snapshot(self, alive)
        await self._producer.send(STATUS_TOPIC, key=self.client_id.encode(), value=status.encode())

    def beat(self) -> None:
        """Publish a heartbeat now (after a rebalance), not at the next tick."""
        self._beat.set()

    async def _heartbeat(self) -> None:
        while True:
            self._beat.clear()
            await self._publish_status()
            try:
                await asyncio.wait_for(self._beat.wait(), HEARTBEAT_SECONDS)
            except TimeoutError:
                pass

    async def _timer(self, spec: TimerSpec) -> None:
        while True:
            await asyncio.sleep(spec.seconds)
            async with self.lock:
                try:
                    await self._fire_timer(spec)
                except Exception:  # noqa: BLE001 - a failing timer must not stop the worker
                    log.exception("timer %s failed", spec.fn.__qualname__)

    async def _fire_timer(self, spec: TimerSpec) -> None:
        if not spec.per_processor:
            result = spec.fn()
            if inspect.isawaitable(result):
                await result
            return
        for member in self.members:
            for proc in list(member.processors.values()):
                outbox = Outbox()
                ctx = TimerContext(outbox, proc.id)
                proc.bind()
                result = spec.fn(ctx)
                if inspect.isawaitable(result):
                    await result
                for topic, key, value, headers in outbox.items:
                    await self.output.send(topic, key, value, headers)


class TimerContext(Context):
    """Context of a per-processor timer: no input record; `send` adds no source header."""

    __slots__ = ()

    def __init__(self, outbox: Outbox, processor: int) -> None:
        super().__init__(outbox)
        self.processor = processor

    def send(self, topic: Any, key: Any, value: Any, headers: Any = ()) -> None:
        self._outbox.add(topic, key, value, list(headers))


def run_worker(app: App, members: int = 1, bootstrap: str | None = None) -> None:
    """Run a worker until SIGTERM/SIGINT; checkpoints and leaves the group on the way out."""

    async def main() -> None:
        worker = Worker(app, members, bootstrap)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        await worker.run()

    asyncio.run(main())
