"""What a worker shows of its members, built when asked: the metrics view of a scrape
(``streamkit.ops.metrics.WorkerView``) and the heartbeat (``status.WorkerStatus``). Nothing
here is counted on the hot path; both read the members' parts as they are."""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import TopicPartition

from streamkit.ops.metrics import Durations, PartitionView, ProcessorView, TableView, WorkerView
from streamkit.runtime.member import GroupMember
from streamkit.runtime.output import Output
from streamkit.runtime.status import WorkerStatus, changelog_positions, ic_counts, skipped_counts

__all__ = ["worker_status", "worker_view"]


def worker_view(app: str, worker: str, members: Sequence[GroupMember], output: Output) -> WorkerView:
    """What a metrics scrape shows (read on the worker's loop)."""
    partitions, processors, changelog = [], [], {}
    held = 0
    for m in members:
        assigned = m.consumer.assignment()
        for task in m.tasks.active.values():  # what each hosted processor reads, and where it is
            view = task.view()
            held += view.held
            for topic, partition in view.partitions:
                tp = TopicPartition(topic, partition)
                hw = m.consumer.highwater(tp) if assigned and tp in assigned else None
                partitions.append(
                    PartitionView(topic, partition, view.processor, view.positions[(topic, partition)], hw)
                )
        processors += [ProcessorView(pid, "active") for pid in m.processors]
        for pid, lag in m.joining.progress.items():
            state = "receiving" if pid in m.processors else "bootstrapping"
            processors.append(ProcessorView(pid, state, lag.get("t2", 0), lag.get("t1", 0)))
        processors += [
            ProcessorView(pid, "restoring", r["at"], r["end"]) for pid, r in m.tasks.restores.running.items()
        ]
        changelog.update(changelog_positions(m.processors.values()))
    checkpoints, handler_batches, gate_waits = Durations(), Durations(), Durations()
    strays_waiting: dict[str, int] = {}
    tables = []
    for m in members:
        checkpoints.add(m.tasks.checkpoint_seconds)
        handler_batches.add(m.dispatcher.handler_batches)
        gate_waits.add(m.admission.gate_wait_seconds)
        for tp, route in m.admission:
            if route.swept and (hw := m.consumer.highwater(tp) if tp in m.consumer.assignment() else None):
                strays_waiting[f"{tp.topic}/{tp.partition}"] = max(0, hw - route.position)
        for pid, proc in m.processors.items():
            for name, cache in proc.caches.items():
                keys, size = proc.store.table_size(name)
                tables.append(TableView(pid, name, keys, size, cache.cached_count, cache.misses, cache.reads_spared))
    return WorkerView(
        app=app,
        worker=worker,
        applied=sum((m.dispatcher.applied for m in members), Counter()),
        sent=dict(output.sent),
        dead_letters=dict(output.dead_letter_counts),
        strays_forwarded=dict(output.strays_forwarded),
        partitions=partitions,
        ic_ranges=ic_counts(p for m in members for p in m.processors.values()),
        processors=processors,
        changelog={pid: at for pid, (at, _) in changelog.items()},
        rebalances=sum(m.tasks.rebalances for m in members),
        gated=sum(r.limit is not None for m in members for _, r in m.admission),
        checkpoints=checkpoints,
        handler_batches=handler_batches,
        gate_waits=gate_waits,
        strays_waiting=strays_waiting,
        tables=tables,
        holes={
            "asked_again": sum(m.admission.holes_refetched for m in members),
            "read_past": sum(m.admission.holes_read_past for m in members),
        },
        merge_held=held,
        merge_long_waits=sum(m.tasks.long_waits() for m in members),
        skipped=skipped_counts((m.admission for m in members), members[0].app if members else None),
    )


def worker_status(
    app: str,
    worker: str,
    members: Sequence[GroupMember],
    output: Output,
    *,
    alive: bool = True,
    query_url: str | None = None,
    global_tables: Mapping[str, Mapping[str, Any]] | None = None,
    standbys: Mapping[int, Mapping[str, Any]] | None = None,
) -> WorkerStatus:
    """A worker's heartbeat: the (topic, partition)s each hosted processor consumes, its
    counts, its output's dead-letter figures and what it skipped on purpose."""
    hosted: dict[int, list[tuple[str, int]]] = {}
    for m in members:
        for pid, parts in m.hosted().items():
            hosted.setdefault(pid, []).extend(parts)
    processors = [proc for m in members for proc in m.processors.values()]
    return WorkerStatus(
        app=app,
        worker=worker,
        pid=os.getpid(),
        host=socket.gethostname(),
        at=time.time(),
        alive=alive,
        processors={pid: sorted(parts) for pid, parts in hosted.items()},
        handled=sum(m.dispatcher.handled for m in members),
        handler_s=sum(m.dispatcher.handler_batches.total for m in members),
        checkpoint_s=sum(m.tasks.checkpoint_seconds.total for m in members),
        dead_letters=dict(output.dead_letter_counts),
        strays_forwarded=dict(output.strays_forwarded),
        consecutive_failures=max((m.dispatcher.consecutive_failures for m in members), default=0),
        last_error=output.last_error,
        joining={pid: dict(lag) for m in members for pid, lag in m.joining.progress.items()},
        restoring={pid: dict(at) for m in members for pid, at in m.tasks.restores.running.items()},
        query_url=query_url,
        global_tables={name: dict(v) for name, v in (global_tables or {}).items()},
        ic_ranges=ic_counts(processors),
        changelog=changelog_positions(processors),
        standbys={pid: dict(v) for pid, v in (standbys or {}).items()},
        skipped=skipped_counts((m.admission for m in members), members[0].app if members else None),
    )
