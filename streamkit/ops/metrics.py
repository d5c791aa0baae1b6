"""A worker's Prometheus metrics, read from the worker when Prometheus scrapes.

The worker keeps the counts it keeps anyway (for ``status``, its checkpoints, its
heartbeats), plus a few per partition batch (records applied, time in the handlers) and
per record sent, and, at each scrape, hands a :class:`WorkerView` of them over from its
event loop (``serve``: the HTTP server's
thread asks the loop for one, so nothing is read while the loop changes it). The
families are built from that view by :class:`WorkerCollector`; names and labels follow
Prometheus' conventions (``streamkit_`` prefix, ``_total`` counters, ``_seconds``).
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

__all__ = [
    "METRICS", "Durations", "PartitionView", "ProcessorView", "TableView", "WorkerCollector", "WorkerView", "serve",
    "serve_collector",
]  # fmt: skip

BOUNDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Durations:
    """Observed durations as a cumulative histogram (what Prometheus' histograms are):
    kept by the worker as plain counts, read at each scrape."""

    bounds: tuple[float, ...] = BOUNDS
    counts: list[int] = field(default_factory=lambda: [0] * (len(BOUNDS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def add(self, other: Durations) -> None:
        """Count ``other``'s observations too (several members' into one worker's)."""
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.total += other.total

    def buckets(self) -> list[tuple[str, float]]:
        """``(upper bound, observations at or below it)``, cumulative, ending with +Inf."""
        out, running = [], 0
        for bound, n in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, float(running)))
        return out


@dataclass(frozen=True)
class PartitionView:
    topic: str
    partition: int
    processor: int
    position: int
    """The next offset the processor applies."""
    high_watermark: int | None
    """None: the consumer has not fetched the partition yet."""


@dataclass(frozen=True)
class ProcessorView:
    processor: int
    state: str
    """active, bootstrapping (joining), receiving (a shrink's staging store) or restoring."""
    done: int = 0
    """Bootstrap: T2 (the input positions reached); restore: the changelog offset read to."""
    target: int = 0
    """Bootstrap: T1 (where its keys' owners are); restore: the changelog's end."""


@dataclass(frozen=True)
class TableView:
    """One table of one hosted processor: its store and its cache."""

    processor: int
    table: str
    keys: int
    """RocksDB's estimate of the keys stored (committed state)."""
    store_bytes: int
    """SST files and memtables of the table's column family."""
    cached: int
    """Entries in the table's cache (absent keys remembered included)."""
    misses: int
    """Reads the cache could not answer since the processor was opened."""
    reads_spared: int
    """Of those, the ones the filter of the table's stored keys answered (a key the store
    lacks) without reading the store."""


@dataclass
class WorkerView:
    """What one scrape shows of a worker (built on its event loop)."""

    app: str
    worker: str
    applied: Mapping[str, int]
    """Records handed to the handlers, per input topic."""
    sent: Mapping[str, int]
    """Records sent by handlers, per output topic."""
    dead_letters: Mapping[str, int]
    strays_forwarded: Mapping[str, int]
    """Per "topic/partition" the strays lay in."""
    partitions: list[PartitionView]
    ic_ranges: Mapping[str, int]
    processors: list[ProcessorView]
    changelog: Mapping[int, int]
    """Per processor: its changelog position."""
    rebalances: int
    gated: int
    """Partitions held by their gate now (waiting for the group to pass a seal)."""
    checkpoints: Durations
    """Each checkpoint's duration: the pause of the member's loop."""
    handler_batches: Durations
    """Each partition batch's time in the handlers."""
    gate_waits: Durations = field(default_factory=Durations)
    """Each wait of a partition at its gate (from its closing to its opening)."""
    strays_waiting: Mapping[str, int] = field(default_factory=dict)
    """Per "topic/partition" a sweep reads (no layout reads it in place): records not forwarded yet."""
    tables: list[TableView] = field(default_factory=list)
    holes: Mapping[str, int] = field(default_factory=dict)
    """Offset gaps in fetch answers: "asked_again" (each seen), "read_past" (confirmed real)."""
    merge_held: int = 0
    """Records the time-ordered merge holds now (every processor of the worker)."""
    merge_long_waits: int = 0
    """Times a merge waited over 5 s for a partition said to lag that brought nothing."""
    skipped: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Records skipped on purpose, per kind: "malformed" per internal topic, "copies" and
    "duplicate_strays" per "topic/partition" (the heartbeat's ``skipped``)."""


METRICS: dict[str, str] = {
    "streamkit_records_applied_total": "records handed to the handlers, per input topic (a record a handler "
    "failed on is also among the dead letters)",
    "streamkit_records_sent_total": "records the handlers sent, per output topic",
    "streamkit_dead_letters_total": "records sent to the dead-letter topic, per reason",
    "streamkit_strays_forwarded_total": "strays forwarded to where the layout places their key, per partition",
    "streamkit_records_skipped_total": "records skipped on purpose: malformed (a record of an internal topic "
    "that did not decode, per topic), copy (a copy for compaction, per partition), duplicate-stray (a second copy "
    "of a forwarded stray, per partition)",
    "streamkit_windows_missed_total": "closed windows that records late for them did not join while joining the "
    "open ones (hopping, sliding), per windowed table",
    "streamkit_join_unmatched_failures_total": "calls of a left or outer join for a record that met nobody that "
    "raised, per join (each logged)",
    "streamkit_partition_position": "the next offset a processor applies, per partition",
    "streamkit_partition_high_watermark": "the partition's high watermark as the consumer last saw it",
    "streamkit_partition_lag": "records between a processor's position and the high watermark",
    "streamkit_partition_ic_ranges": "IC ranges in the partition's last checkpoint (records applied out of order)",
    "streamkit_partitions_gated": "partitions held by their gate (waiting for the group to pass a seal)",
    "streamkit_processor_state": "1 for each hosted processor's state (active, bootstrapping, receiving, restoring)",
    "streamkit_processor_progress": "a bootstrapping or restoring processor's progress (done) and goal (target)",
    "streamkit_changelog_position": "the changelog position a processor's store matches",
    "streamkit_rebalances_total": "group rebalances this worker's members took an assignment from",
    "streamkit_fetch_holes_total": "gaps in the offsets of a fetch answer: asked_again (each gap seen), "
    "read_past (still there after a second of asking: compaction, transaction markers or retention; anything "
    "else is records lost)",
    "streamkit_merge_held_records": "records the time-ordered merge of a processor's input partitions holds (an "
    "earlier record of another partition may still come)",
    "streamkit_merge_long_waits_total": "times a processor's merge waited over 5 s for a partition that has records "
    "not fetched yet (its other inputs wait with it; a lasting wait is a fetch or broker problem)",
    "streamkit_checkpoint_seconds": "checkpoint duration: the member's loop pauses this long",
    "streamkit_handler_batch_seconds": "time in the handlers per partition batch",
    "streamkit_gate_wait_seconds": "how long a partition waited at its gate for the group to pass a seal",
    "streamkit_strays_waiting": "records of a swept partition (reserved, or drained) not forwarded yet",
    "streamkit_store_keys": "keys in a processor's table as stored (RocksDB's estimate)",
    "streamkit_store_bytes": "bytes of a processor's table in RocksDB (SST files and memtables)",
    "streamkit_cache_entries": "entries in a processor's table cache",
    "streamkit_cache_misses_total": "reads a table's cache could not answer (queries' reads included); the hit "
    "rate is 1 - misses / reads, where reads are the records applied times the table reads per record",
    "streamkit_store_reads_spared_total": "cache misses answered without reading the store: the key is not in "
    "the filter of the table's stored keys (a new key); the store was read for the other misses",
}
"""Every metric a worker serves, with its help text (the README's table lists them)."""


def _fam(kind: type[Any], name: str, labels: list[str]) -> Any:
    return kind(name.removesuffix("_total") if kind is CounterMetricFamily else name, METRICS[name], labels=labels)


class WorkerCollector(Collector):
    """The metric families of one :class:`WorkerView` per scrape."""

    def __init__(self, view: Callable[[], WorkerView]) -> None:
        self.view = view

    def collect(self) -> Iterator[Any]:
        v = self.view()
        base = [v.app, v.worker]
        labels = ["app", "worker"]
        per_topic = [
            ("streamkit_records_applied_total", v.applied, "topic"),
            ("streamkit_records_sent_total", v.sent, "topic"),
            ("streamkit_dead_letters_total", v.dead_letters, "reason"),
            ("streamkit_strays_forwarded_total", v.strays_forwarded, "partition"),
        ]
        for name, counts, label in per_topic:
            fam = _fam(CounterMetricFamily, name, [*labels, label])
            for what, n in sorted(counts.items()):
                fam.add_metric([*base, what], n)
            yield fam
        yield self._skipped(v, base, labels)
        for name, kind, label in (
            ("streamkit_windows_missed_total", "missed_windows", "table"),
            ("streamkit_join_unmatched_failures_total", "failed_unmatched", "join"),
        ):
            fam = _fam(CounterMetricFamily, name, [*labels, label])
            for what, n in sorted(v.skipped.get(kind, {}).items()):
                fam.add_metric([*base, what], n)
            yield fam
        part_labels = [*labels, "topic", "partition", "processor"]
        position = _fam(GaugeMetricFamily, "streamkit_partition_position", part_labels)
        high = _fam(GaugeMetricFamily, "streamkit_partition_high_watermark", part_labels)
        lag = _fam(GaugeMetricFamily, "streamkit_partition_lag", part_labels)
        for p in v.partitions:
            values = [*base, p.topic, str(p.partition), str(p.processor)]
            position.add_metric(values, p.position)
            if p.high_watermark is not None:
                high.add_metric(values, p.high_watermark)
                lag.add_metric(values, max(0, p.high_watermark - p.position))
        yield from (position, high, lag)
        ic = _fam(GaugeMetricFamily, "streamkit_partition_ic_ranges", [*labels, "partition"])
        for where, n in sorted(v.ic_ranges.items()):
            ic.add_metric([*base, where], n)
        yield ic
        gated = _fam(GaugeMetricFamily, "streamkit_partitions_gated", labels)
        gated.add_metric(base, v.gated)
        yield gated
        state = _fam(GaugeMetricFamily, "streamkit_processor_state", [*labels, "processor", "state"])
        progress = _fam(GaugeMetricFamily, "streamkit_processor_progress", [*labels, "processor", "state", "of"])
        for proc in v.processors:
            state.add_metric([*base, str(proc.processor), proc.state], 1)
            if proc.state != "active":
                progress.add_metric([*base, str(proc.processor), proc.state, "done"], proc.done)
                progress.add_metric([*base, str(proc.processor), proc.state, "target"], proc.target)
        yield from (state, progress)
        logged = _fam(GaugeMetricFamily, "streamkit_changelog_position", [*labels, "processor"])
        for pid, at in sorted(v.changelog.items()):
            logged.add_metric([*base, str(pid)], at)
        yield logged
        rebalances = _fam(CounterMetricFamily, "streamkit_rebalances_total", labels)
        rebalances.add_metric(base, v.rebalances)
        yield rebalances
        holes = _fam(CounterMetricFamily, "streamkit_fetch_holes_total", [*labels, "outcome"])
        for outcome, n in sorted(v.holes.items()):
            holes.add_metric([*base, outcome], n)
        yield holes
        held = _fam(GaugeMetricFamily, "streamkit_merge_held_records", labels)
        held.add_metric(base, v.merge_held)
        waits = _fam(CounterMetricFamily, "streamkit_merge_long_waits_total", labels)
        waits.add_metric(base, v.merge_long_waits)
        yield from (held, waits)
        waiting = _fam(GaugeMetricFamily, "streamkit_strays_waiting", [*labels, "partition"])
        for where, n in sorted(v.strays_waiting.items()):
            waiting.add_metric([*base, where], n)
        yield waiting
        table_labels = [*labels, "processor", "table"]
        keys = _fam(GaugeMetricFamily, "streamkit_store_keys", table_labels)
        size = _fam(GaugeMetricFamily, "streamkit_store_bytes", table_labels)
        cached = _fam(GaugeMetricFamily, "streamkit_cache_entries", table_labels)
        misses = _fam(CounterMetricFamily, "streamkit_cache_misses_total", table_labels)
        spared = _fam(CounterMetricFamily, "streamkit_store_reads_spared_total", table_labels)
        for t in v.tables:
            values = [*base, str(t.processor), t.table]
            keys.add_metric(values, t.keys)
            size.add_metric(values, t.store_bytes)
            cached.add_metric(values, t.cached)
            misses.add_metric(values, t.misses)
            spared.add_metric(values, t.reads_spared)
        yield from (keys, size, cached, misses, spared)
        for name, durations in (
            ("streamkit_checkpoint_seconds", v.checkpoints),
            ("streamkit_handler_batch_seconds", v.handler_batches),
            ("streamkit_gate_wait_seconds", v.gate_waits),
        ):
            fam = _fam(HistogramMetricFamily, name, labels)
            fam.add_metric(base, durations.buckets(), sum_value=durations.total)
            yield fam

    @staticmethod
    def _skipped(v: WorkerView, base: list[str], labels: list[str]) -> Any:
        """``streamkit_records_skipped_total`` by reason: malformed per topic (partition
        empty), copy and duplicate-stray per "topic/partition" (topic: its topic)."""
        fam = _fam(CounterMetricFamily, "streamkit_records_skipped_total", [*labels, "reason", "topic", "partition"])
        for topic, n in sorted(v.skipped.get("malformed", {}).items()):
            fam.add_metric([*base, "malformed", topic, ""], n)
        for kind, reason in SKIP_REASONS:
            for where, n in sorted(v.skipped.get(kind, {}).items()):
                fam.add_metric([*base, reason, where.rpartition("/")[0], where], n)
        return fam


SKIP_REASONS = (("copies", "copy"), ("duplicate_strays", "duplicate-stray"))
"""The heartbeat's kinds of records skipped per partition, and their metric's reason."""


def serve(
    view: Callable[[], Coroutine[Any, Any, WorkerView]],
    port: int,
    loop: asyncio.AbstractEventLoop,
    host: str = "127.0.0.1",
) -> Callable[[], None]:
    """Serve the worker's metrics on ``host:port`` (``metrics_bind``: this machine only
    unless told otherwise) from a thread of its own; each scrape asks ``loop`` for a view
    (at most 5 s). Returns what stops the server."""

    def on_loop() -> WorkerView:
        return asyncio.run_coroutine_threadsafe(view(), loop).result(timeout=5.0)

    return serve_collector(WorkerCollector(on_loop), port, host)


def serve_collector(collector: Collector, port: int, host: str = "127.0.0.1") -> Callable[[], None]:
    """Serve ``collector``'s metrics on ``host:port`` from a thread of its own; returns what
    stops the server."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server, thread = start_http_server(port, addr=host, registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop
