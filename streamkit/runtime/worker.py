"""A worker process: K group members, the shared producer, timers and heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Any

from aiokafka import AIOKafkaProducer

from stores.tuning import relax_malloc_trim
from streamkit.app import App
from streamkit.broker import EmbeddedBroker, wait_for_broker
from streamkit.compiled import log_build_status
from streamkit.connection import Connection, as_connection
from streamkit.errors import ConfigError
from streamkit.exactly_once.writer import Writers
from streamkit.joins.fed_table import copartition_problem
from streamkit.joins.global_store import GlobalStores
from streamkit.kafkaio import KafkaIO
from streamkit.layout.model import TopicLayout
from streamkit.layout.registry import LayoutRegistry
from streamkit.ops.exposure import serving_problem
from streamkit.ops.metrics import WorkerView
from streamkit.ops.metrics import serve as serve_metrics
from streamkit.ops.queries import advertised_url, serve_queries, server_tls
from streamkit.producer import Producer, ProducerConfig
from streamkit.runtime.adoption import ADOPTION_WAIT, LayoutAdoptions
from streamkit.runtime.collector import fewer_collections
from streamkit.runtime.jobmeta import JobLayout, JobWatcher, resolve_job
from streamkit.runtime.member import GroupMember
from streamkit.runtime.output import Output
from streamkit.runtime.processor import ProcessorState, StateMemory, check_local_stores
from streamkit.runtime.progress import ProgressLog
from streamkit.runtime.queries import QueryAnswers
from streamkit.runtime.services import Services
from streamkit.runtime.standbys import StandbyKeeper
from streamkit.runtime.status import STATUS_TOPIC
from streamkit.runtime.timers import run_timer
from streamkit.runtime.views import worker_status, worker_view
from streamkit.state.changelog import CHANGELOG_BATCH_BYTES, ChangelogWriter, changelog_topic

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 2.0
AUX_STOP_SECONDS = 5.0
"""How long a stopping worker waits for its cancelled timers and heartbeat to end."""


class Worker:
    def __init__(
        self, app: App, members: int = 1, bootstrap: str | Connection | None = None, *, embedded: bool = False
    ) -> None:
        """``embedded``: with no broker named anywhere, start one in this process (only when
        asked: ``streamkit worker --embedded-broker``), else refuse to start."""
        if members < 1:
            raise ConfigError(f"a worker runs at least one processor, not {members}")
        self.app = app
        self.member_count = members
        self.connection = bootstrap if isinstance(bootstrap, Connection) else app.connection(bootstrap)
        self.bootstrap = self.connection.bootstrap if self.connection is not None else None
        self.client_id = f"{app.name}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.members: list[GroupMember] = []
        self.services: Services | None = None
        self._embedded: EmbeddedBroker | None = None
        self._embed = embedded
        self._stop = asyncio.Event()
        self._beat = asyncio.Event()
        self._stop_metrics: Callable[[], None] | None = None
        self._stop_queries: Callable[[], Awaitable[None]] | None = None
        self.query_url: str | None = None
        self._producer: AIOKafkaProducer | None = None
        self._output_producer: Producer | None = None
        self._changelog_producer: AIOKafkaProducer | None = None
        self._io: KafkaIO | None = None
        self._registry: LayoutRegistry | None = None
        self._globals: GlobalStores | None = None
        self._standbys: StandbyKeeper | None = None

    async def prepare(self) -> Services:
        """Resolve the broker and the job (p0), check topics, start the shared parts."""
        relax_malloc_trim()  # checkpoints serialise many values at once: see stores.tuning
        log_build_status(log)  # a warning where the hot path runs as Python source
        app = self.app
        if not app.handlers:
            raise ConfigError(f"app {app.name!r} has no @app.processor handler: nothing to run")
        problem = copartition_problem(app.tables.values(), (app.topics[name] for name in app.handlers))
        if problem is not None:
            raise ConfigError(problem)
        if self.connection is None:
            if not self._embed:  # nothing listens on the network unless asked
                raise ConfigError(
                    f"app {app.name!r}: no broker: give one (App(broker=...), STREAMKIT_BROKER) or ask for an "
                    "embedded one (streamkit worker --embedded-broker)"
                )
            self._embedded = EmbeddedBroker()
            self.connection = as_connection(self._embedded.bootstrap)
            self.bootstrap = self._embedded.bootstrap
            log.warning("no broker given: started an embedded broker at %s", self.bootstrap)
        elif self.connection.security_protocol == "PLAINTEXT":
            log.info("connecting to broker %s (retrying for up to 10 s)", self.connection.describe())
            await asyncio.to_thread(wait_for_broker, self.connection.bootstrap, 10.0)  # BrokerError: one line
        else:  # the probe speaks plain Kafka; a secured listener answers the clients themselves
            log.info("connecting to broker %s", self.connection.describe())
        bootstrap = self.connection
        io = self._io = await KafkaIO(bootstrap, client_id=self.client_id).start()
        counts = await io.partition_counts(app.input_topics)
        await io.create_topic(app.dead_letter_topic, 1)
        await io.create_topic(STATUS_TOPIC, 1)
        self._producer = AIOKafkaProducer(  # internal records: heartbeats, progress
            **bootstrap.client_kwargs(),
            client_id=self.client_id,
            acks="all",
            linger_ms=0,
        )
        await self._producer.start()
        registry = self._registry = LayoutRegistry(
            bootstrap, client_id=self.client_id, io=io, epoch_wait=app.settings.layout_epoch_wait
        )
        await registry.start()
        await registry.refresh()
        seal = await registry.load_origin_seal()
        # a topic with a layout counts its initial partitions, not its physical ones
        initial = dict(counts)
        for topic in counts:
            if (layout := registry.get(topic)) is not None:
                initial[topic] = layout.n0
        job = await resolve_job(
            io, app.name, app.settings.processors, initial[app.input_topics[0]], tuple(app.input_topics)
        )
        await asyncio.to_thread(
            check_local_stores, app.store_path(0, app.settings.state_dir).parent, app.name, job.incarnation
        )
        self._globals = await open_global_tables(app, io, registry, job.incarnation)
        registry.add_listener(self._on_layout_change)
        registry.watch(app.settings.layout_poll_interval)
        progress = ProgressLog(io, self._producer, app.group_id)
        await progress.start()
        adoptions = LayoutAdoptions()
        changelog = None
        if app.settings.changelog:
            self._changelog_producer = AIOKafkaProducer(  # large batches: one round trip per CHANGELOG_BATCH_BYTES
                **bootstrap.client_kwargs(),
                client_id=self.client_id,
                acks="all",
                linger_ms=0,
                max_batch_size=CHANGELOG_BATCH_BYTES,
                max_request_size=2 * CHANGELOG_BATCH_BYTES,
            )
            await self._changelog_producer.start()
            changelog = ChangelogWriter(self._changelog_producer, io, changelog_topic(app.name))
            await changelog.ensure(job.p, create=app.settings.changelog_partitions)
        elif app.settings.standby_replicas:
            raise ConfigError(
                f"app {app.name!r}: standby_replicas={app.settings.standby_replicas} needs the changelog "
                "(standbys are kept from it): drop changelog=False, or set standby_replicas=0"
            )
        memory = StateMemory.of(
            app.settings.state_cache_bytes, app.settings.rocksdb_block_cache_bytes, app.settings.rocksdb_memtable_bytes
        )
        standbys = None
        if changelog is not None and app.settings.standby_replicas:
            app_dir = app.store_path(0, app.settings.state_dir).parent
            standbys = self._standbys = StandbyKeeper(
                app_dir, app.tables, io, changelog.topic, job.incarnation, configure=memory.rocksdb
            )
            await asyncio.to_thread(standbys.scan)
        self._output_producer = await Producer(
            bootstrap,
            client_id=self.client_id,
            config=ProducerConfig(
                linger_ms=app.settings.output_linger_ms,
                refresh_ms=max(100, int(app.settings.layout_poll_interval * 1000)),
                before_ack=partial(adoptions.wait, timeout=ADOPTION_WAIT),
            ),
        ).start()
        for sink in app.sinks.values():
            await asyncio.to_thread(sink.open)
        writers = Writers(app.name) if app.settings.processing == "exactly_once" else None
        output = Output(app.name, app.dead_letter_topic, app.topics, self._output_producer, seal, writers)
        self.services = Services(
            connection=bootstrap,
            client_id=self.client_id,
            jobs=JobWatcher(io, job, self._on_job_change),
            io=io,
            registry=registry,
            progress=progress,
            output=output,
            lock=asyncio.Lock(),
            beat=self._beat.set,
            adoptions=adoptions,
            changelog=changelog,
            standbys=standbys,
            memory=memory,
            plain_partitions={t: n for t, n in counts.items() if registry.get(t) is None},
        )
        return self.services

    def _on_job_change(self, job: JobLayout) -> None:
        for member in self.members:
            member.on_job_change(job)

    def _on_layout_change(self, new: TopicLayout, old: TopicLayout | None) -> None:
        for member in self.members:
            member.on_layout_change(new, old)

    def _serving_processors(self) -> list[ProcessorState]:
        return [proc for m in self.members for proc in m.serving()]

    async def run(self) -> None:
        if (problem := serving_problem(self.app.settings)) is not None:  # before anything is opened
            raise ConfigError(f"app {self.app.name!r}: {problem}")
        try:
            services = await self.prepare()
        except BaseException:  # a refused start leaves nothing open (clients, an embedded broker)
            await self.shutdown(clean=False)
            raise
        self.members = [GroupMember(self.app, services, i) for i in range(self.member_count)]
        try:
            for m in self.members:
                await m.start()
            await self._serve(services)
        except BaseException:  # e.g. a port in use: one line, and nothing left open
            await self.shutdown(clean=False)
            raise
        with fewer_collections(self.app.settings.gc_threshold):
            runs = [asyncio.create_task(m.run(), name=m.name) for m in self.members]
            aux = [
                asyncio.create_task(
                    run_timer(
                        t,
                        processors=self._serving_processors,
                        tables=self.app.tables,
                        output=services.output,
                        lock=services.lock,
                    )
                )
                for t in self.app.timers
            ]
            aux.append(asyncio.create_task(self._heartbeat()))
            if self._globals is not None:
                aux.append(asyncio.create_task(self._globals.follow(services.io), name="global tables"))
            if services.standbys is not None:
                aux.append(asyncio.create_task(services.standbys.follow(), name="standbys"))
            aux.append(asyncio.create_task(services.jobs.run()))
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
                for m, t in zip(self.members, runs, strict=True):
                    # never in the middle of a batch; but a member waiting for records may wait
                    # for a whole rebalance (getmany waits for the new assignment): not for that
                    if failed is not None or m.awaiting_records:
                        t.cancel()
                # the others leave their loop after their batch; one that failed in it fails the stop
                ended = await asyncio.gather(*runs, return_exceptions=True)
                if failed is None:
                    failed = next((e for e in ended if isinstance(e, Exception)), None)
                await _cancelled([*aux, stop])
                await self.shutdown(clean=failed is None)
        if failed is not None:
            raise failed

    def stop(self) -> None:
        if not self._stop.is_set():
            log.info("stopping: checkpointing and leaving the group")
        self._stop.set()

    async def _serve(self, services: Services) -> None:
        """The queries and metrics servers the settings ask for."""
        if (port := self.app.settings.query_port) is not None:
            s = self.app.settings
            answers = QueryAnswers(self.app, lambda: self.members, services.jobs, services.io, self.client_id)
            cert, key = s.query_tls_certfile, s.query_tls_keyfile  # both or neither (the settings say so)
            tls = server_tls(cert, key) if cert and key else None
            token = s.query_token.get_secret_value() if s.query_token else None
            with _serving("query", s.query_bind, port):
                self._stop_queries = await serve_queries(answers, port, s.query_bind, token=token, ssl_context=tls)
            self.query_url = advertised_url(port, s.query_bind, s.query_host, socket.gethostname(), tls is not None)
            log.info("queries of state by key at %s (bound to %s)", self.query_url, s.query_bind)
        if (port := self.app.settings.metrics_port) is not None:
            bind = self.app.settings.metrics_bind
            with _serving("metrics", bind, port):
                self._stop_metrics = serve_metrics(self.metrics_view, port, asyncio.get_running_loop(), bind)
            log.info("metrics on %s port %d (Prometheus)", bind, port)

    async def metrics_view(self) -> WorkerView:
        """What a metrics scrape shows (``streamkit.ops.metrics``), read on the loop."""
        assert self.services is not None
        return worker_view(self.app.name, self.client_id, self.members, self.services.output)

    async def shutdown(self, clean: bool = True) -> None:
        """Leave the group; checkpoint first unless a failure may have left a batch half done."""
        started = time.monotonic()
        if self._stop_metrics is not None:
            self._stop_metrics()
            self._stop_metrics = None
        if self._stop_queries is not None:
            await self._stop_queries()
            self._stop_queries = None
        for m in self.members:
            try:
                log.info("%s: stopping (%s)", m.name, "checkpoint first" if clean else "no checkpoint")
                await m.stop(checkpoint=clean)
            except Exception:  # noqa: BLE001 - keep stopping the others
                log.exception("%s: error while stopping", m.name)
        if self._globals is not None:
            self._globals.close()
            self._globals = None
        if self._standbys is not None:
            await self._standbys.aclose()
            self._standbys = None
        if self._output_producer is not None:
            await self._output_producer.stop()
        for sink in self.app.sinks.values():
            sink.close()
        if self._changelog_producer is not None:
            await self._changelog_producer.stop()
        if self._registry is not None:
            await self._registry.stop()
        if self._producer is not None:
            try:
                if self.services is not None:
                    await self._publish_status(alive=False)
            finally:
                await self._producer.stop()
        if self._io is not None:
            await self._io.close()
        if self._embedded is not None:
            self._embedded.stop()
        log.info("stopped in %.1f s", time.monotonic() - started)

    async def _publish_status(self, alive: bool = True) -> None:
        assert self._producer is not None and self.services is not None
        status = worker_status(
            self.app.name, self.client_id, self.members, self.services.output, alive=alive, query_url=self.query_url,
            global_tables=self._globals.status() if self._globals is not None else {},
            standbys=self._standbys.report() if self._standbys is not None else {},
        )  # fmt: skip
        await self._producer.send(STATUS_TOPIC, key=self.client_id.encode(), value=status.encode())

    async def _heartbeat(self) -> None:
        while True:
            self._beat.clear()
            await self._publish_status()
            try:
                async with asyncio.timeout(HEARTBEAT_SECONDS):
                    await self._beat.wait()
            except TimeoutError:
                pass


async def _cancelled(tasks: list[asyncio.Task[Any]]) -> None:
    """Wait for cancelled helper tasks to end, but not forever: one that swallowed its
    cancellation must not keep the worker from checkpointing and leaving."""
    _, pending = await asyncio.wait(tasks, timeout=AUX_STOP_SECONDS)
    for task in pending:
        log.warning("task %s did not end %.0f s after its cancellation; stopping without it", task.get_name(),
                    AUX_STOP_SECONDS)  # fmt: skip


async def open_global_tables(app: App, io: KafkaIO, registry: LayoutRegistry, incarnation: str) -> GlobalStores | None:
    """The app's global tables, each read to its topic's end (None: it has none). Refused
    with one line: a source topic that does not exist, or one whose layout changed (a key
    must stay in one partition for its latest value to be known)."""
    if not app.global_tables:
        return None
    for table in app.global_tables.values():
        topic = table.topic.name
        if await io.partition_count(topic) is None:
            raise ConfigError(f"global table {table.name!r}: its topic {topic!r} does not exist")
        layout = registry.get(topic)
        if layout is not None and (layout.seals or layout.active != layout.n0):
            raise ConfigError(
                f"global table {table.name!r}: topic {topic!r} changed its partitions (layout epoch "
                f"{layout.epoch}); a global table needs each key in one partition: give it a topic of its own"
            )
    app_dir = app.store_path(0, app.settings.state_dir).parent
    tables = list(app.global_tables.values())
    stores = await asyncio.to_thread(GlobalStores, tables, app_dir, incarnation, registry.origin_seal)
    try:
        await stores.catch_up(io)
    except BaseException:
        stores.close()
        raise
    return stores


@contextlib.contextmanager
def _serving(setting: str, bind: str, port: int) -> Iterator[None]:
    """A server that cannot listen where the settings say is a configuration error that
    names them (``setting``: query or metrics)."""
    try:
        yield
    except OSError as exc:
        why = (exc.strerror or str(exc)).lower()
        raise ConfigError(f"{setting}_bind={bind!r}, {setting}_port={port}: cannot listen there: {why}") from None


def print_tasks() -> None:
    """Every asyncio task's stack to stderr (SIGUSR2): where a worker that does not stop waits."""
    for task in asyncio.all_tasks():
        print(f"--- task {task.get_name()}", file=sys.stderr)
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()


def run_worker(
    app: App, members: int = 1, bootstrap: str | Connection | None = None, *, embedded: bool = False
) -> None:
    """Run a worker until SIGTERM/SIGINT; checkpoints and leaves the group on the way out
    (``embedded``: see :class:`Worker`)."""

    async def main() -> None:
        worker = Worker(app, members, bootstrap, embedded=embedded)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        loop.add_signal_handler(signal.SIGUSR2, print_tasks)
        await worker.run()

    asyncio.run(main())
