"""Live processor scaling, the member's side: a joining processor's bootstrap, and the
purge of keys that moved away.

Growing a job from ``p`` to ``p + 1`` processors moves the keys of one processor (the
split pointer's) to the new one, processor ``p``. While the job record says processor
``p`` is joining (``JobLayout.joining``), the member hosting the processor that splits
hosts it too, with no rebalance, and rebuilds the state of
those keys from the history (S2, ``rebuild``) up to where the running owner is (T1,
read from the progress log), again and again as the owner moves on, while the owner
keeps consuming and emitting output for every key. Once the gap is small it publishes
the job's next epoch, with ``p + 1`` active; the rebalance that follows moves the keys'
partitions: the old owner checkpoints and lets go at its position, the new owner
replays the last records up to it without output and goes on from there with output.
The old owner then deletes the state of the keys that moved (`purge_moved_keys`), so a
later shrink cannot revive stale values.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import key_hash
from streamkit.app import HandlerSpec
from streamkit.kafkaio import KafkaIO
from streamkit.layout.model import TopicLayout
from streamkit.layout.registry import LayoutRegistry
from streamkit.runtime.dispatch import Dispatcher
from streamkit.runtime.jobmeta import ConcurrentJobChangeError, JobLayout, publish_job
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.progress import ProgressLog
from streamkit.runtime.rebuild import RebuildPlan, plan_rebuild, rebuild
from streamkit.tables import Table

log = logging.getLogger(__name__)

HANDOVER_LAG = 2000
"""Records the joining processor may still be behind its keys' owner when it asks for
the handover (it replays them during the rebalance, without output)."""


def purge_moved_keys(proc: ProcessorState, tables: Mapping[str, Table], p0: int, p: int) -> int:
    """Delete from ``proc``'s store every key that processor count ``p`` places on another
    processor; returns how many were deleted.

    Table keys are taken to be the records' keys (as a handler that keeps state per
    record key writes them), encoded with the table's key serde; a windowed table's
    stored key ends with the 8-byte window start.
    """
    deletes: dict[str, dict[bytes, bytes | None]] = {}
    for name, table in tables.items():
        suffix = 8 if table.window is not None else 0
        gone: dict[bytes, bytes | None] = {}
        for stored, _ in proc.store.items(name):
            key = stored[:-suffix] if suffix else stored
            if lh_bucket(key_hash(key), p0, p) != proc.id:
                gone[stored] = None
        if gone:
            deletes[name] = gone
    loaded = proc.loaded
    proc.store.commit(deletes, loaded.replace(extra={**loaded.extra, "p": p}))
    proc.loaded = proc.store.checkpoint()
    for cache in proc.caches.values():
        cache.invalidate()
    return sum(len(d) for d in deletes.values())


async def bootstrap_joining(
    proc: ProcessorState,
    *,
    job: JobLayout,
    io: KafkaIO,
    registry: LayoutRegistry,
    progress: ProgressLog,
    handlers: Mapping[str, list[HandlerSpec]],
    topics: Mapping[str, tuple[TopicLayout | None, int]],
    dispatcher: Dispatcher,
    lock: asyncio.Lock,
    stamp: Callable[[], tuple[Mapping[str, int], int]],
    group: str,
    checkpoint_every: int,
    checkpoint_interval: float,
    max_rate: float | None,
    report: Callable[[dict[str, int]], None],
    by: str,
) -> JobLayout | None:
    """Rebuild the joining processor ``proc`` (``job.joining``) until it is within
    ``HANDOVER_LAG`` records of its keys' owner, then publish the next epoch of the job
    (returned; None if another writer changed the job first)."""
    p_new = proc.id + 1
    replayed = 0
    owned_t1 = 0

    def checkpointed(read: int) -> None:
        t2 = sum(proc.positions.values())
        report({"t2": t2, "t1": owned_t1, "lag": max(0, owned_t1 - t2), "replayed": replayed + read})

    checkpointed(0)
    first: RebuildPlan | None = None
    while True:
        async with lock:
            await progress.refresh()
        plan = await plan_rebuild(io, proc.id, job.p0, p_new, topics, progress.position)
        if first is None:
            first = plan
        else:  # the partitions it will not own held its keys only before the seals already read
            plan.targets.update({tp: end for tp, end in first.targets.items() if tp not in plan.owned})
        owned_t1 = sum(plan.targets[tp] for tp in plan.owned)
        replayed += await rebuild(
            io=io, registry=registry, proc=proc, handlers=handlers, plan=plan, dispatcher=dispatcher, stamp=stamp,
            group=group, checkpoint_every=checkpoint_every, extra={"p": p_new}, lock=lock,
            checkpoint_interval=checkpoint_interval, max_rate=max_rate, on_checkpoint=checkpointed,
        )  # fmt: skip
        async with lock:
            await progress.refresh()
        t2 = sum(proc.positions.get((tp.topic, tp.partition), 0) for tp in plan.owned)
        t1 = sum(progress.position(tp.topic, tp.partition) for tp in plan.owned)
        report({"t2": t2, "t1": t1, "lag": max(0, t1 - t2), "replayed": replayed})
        if t1 - t2 <= HANDOVER_LAG:
            break
    try:
        grown = await publish_job(io, job.grown(by=by))
    except ConcurrentJobChangeError as exc:
        log.warning("processor %d caught up but the job changed meanwhile: %s", proc.id, exc)
        return None
    log.info("processor %d caught up (%d records replayed, %d behind): job epoch %d has %d processors",
             proc.id, replayed, max(0, t1 - t2), grown.epoch, grown.p)  # fmt: skip
    return grown
