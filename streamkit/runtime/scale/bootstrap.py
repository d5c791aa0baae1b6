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

Shrinking from ``p`` to ``p - 1`` retires processor ``p - 1``; its keys go back to the
processor they came from (the *receiving* one, the split pointer of ``p - 1``). The
receiving processor's store is live, so the bootstrap builds a staging store beside it:
the receiving processor's whole state for ``p - 1`` processors (its own keys and the
retiring ones, from S2, positions and all), up to where the two owners are. At the
handover the staging store replaces the live one (`adopt_store`); the retiring
processor's store is deleted (`delete_retired_stores`). Rebuilding the receiving
processor's own keys too costs a second read of its history, and buys one code path: a
store whose positions say exactly what it has applied, for one key set.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka import TopicPartition

from streamkit.checkpoint_keys import PROCESSOR_COUNT
from streamkit.errors import HistoryTruncatedError
from streamkit.runtime.catchup import CatchUp
from streamkit.runtime.jobmeta import Bootstrap, ConcurrentJobChangeError, JobLayout, publish_job
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.rebuild import Pace, plan_rebuild, rebuild
from streamkit.runtime.scale.staging_seed import seed_marks, wait_logged
from streamkit.state.restore import ChangelogSource, live_changes, seed_plan

log = logging.getLogger(__name__)

NOT_GAINING = 0.8
"""A round that ends more than this share of the last round's gap behind did not gain."""
HANDOVER_LAG = 2000
"""Records the joining processor may still be behind its keys' owner when it asks for
the handover (it replays them during the rebalance, without output)."""


async def seed_from_changelog(
    proc: ProcessorState, source: ProcessorState | None, changelog: ChangelogSource, count: int, log_as: str
) -> bool:
    """Start joining processor ``proc``'s store (empty: a bootstrap that resumes goes on
    from its own positions) from the changelog of ``source``, the processor its keys split
    from, hosted by the same member: its keys' values at the changelog head, and the head's
    input positions (IC ranges and all), marked as a rebuild in progress. The bootstrap
    then reads the input from there, never below. Whether it was seeded (else the
    bootstrap reads the input history from the start, said in one line)."""
    if proc.loaded.positions:
        return False
    if source is None:
        log.info("%s: processor %d bootstraps from the input: its source is not hosted here", log_as, proc.id)
        return False
    if not await wait_logged(source):  # its snapshot is due
        plan, why = None, f"processor {source.id}'s store is not in {changelog.topic} yet"
    else:
        plan, why = await seed_plan(changelog, source.id, proc.id, count, log_as)
    if plan is None:
        log.info("%s: processor %d bootstraps from the input history: %s", log_as, proc.id, why)
        return False
    head = plan.head.checkpoint
    changes = live_changes(plan, changelog.tables)
    proc.store.commit(changes, head.replace(extra=seed_marks(head, count)))
    proc.reload()
    log.info(
        "%s: processor %d seeded from processor %d's changelog: %d keys (%s); input from %s",
        log_as, proc.id, source.id, sum(len(c) for c in changes.values()), why,
        {f"{t}[{p}]": o for (t, p), o in sorted(head.positions.items())},
    )  # fmt: skip
    return True


async def bootstrap_step(
    proc: ProcessorState,
    job: JobLayout,
    step: Bootstrap,
    catchup: CatchUp,
    pace: Pace,
    report: Callable[[dict[str, int]], None],
    seed: Callable[[], Awaitable[bool]] | None = None,
    hold_owner: Callable[[], bool] | None = None,
) -> JobLayout | None:
    """Rebuild ``proc`` for ``step.count`` processors (``job.bootstrap``) until it is within
    ``HANDOVER_LAG`` records of its keys' owners, then publish the next epoch of the job
    (returned; None if another writer changed the job first, or the bootstrap failed: a
    history that is gone stalls the change, another failure is retried at the next
    rebalance). ``catchup``: the host member's history reading (its name is the host, in
    logs and in the job record); ``pace``: the rebuild's checkpoints and rate (its lock
    is the member's); ``report(progress)``: what status shows. ``seed()``: start the
    store from the changelog first (``seed_from_changelog``; whether it did).
    ``hold_owner()``: stop the keys' owner here for the final stretch, when a round did not
    gain on it (a busy worker: its own loop and the bootstrap take turns; whether it did)."""
    io, progress, by = catchup.io, catchup.progress, catchup.name
    what = "receives the retiring processor's keys" if step.staging else "joins the job"
    try:
        seeded = seed is not None and await seed()
        log.info("%s: processor %d %s: rebuilding its state for %d processors without output, from T2 = %d (%s)",
                 by, proc.id, what, step.count, sum(proc.positions.values()),
                 "its changelog seed" if seeded else "its store")  # fmt: skip
        p_new = step.count
        replayed = 0
        owned_t1 = 0
        since_ms = int(time.time() * 1000)

        def publish(t2: int, t1: int, replayed: int) -> None:
            """``status`` shows these (with the rate and an ETA from ``since_ms``)."""
            report({"t2": t2, "t1": t1, "lag": max(0, t1 - t2), "replayed": replayed, "seeded": int(seeded),
                    "saved": sum(proc.loaded.positions.values()), "since_ms": since_ms})  # fmt: skip

        def checkpointed(read: int) -> None:
            publish(sum(proc.positions.values()), owned_t1, replayed + read)

        checkpointed(0)
        owned_ever: set[TopicPartition] = set()
        reached: dict[TopicPartition, int] = {}
        behind: int | None = None  # the gap the last round started from
        while True:
            async with pace.lock or contextlib.nullcontext():
                await progress.refresh()
            # the input topics as they are now: a layout change between rounds changes S1 and S2
            plan = await plan_rebuild(io, proc.id, job.p0, p_new, await catchup.topics(), progress.position)
            # partitions it never owned hold its keys only below seals: a layout change that
            # drops one from S2 leaves it read as far as an earlier round got
            owned_ever |= plan.owned
            for tp, end in reached.items():
                if tp not in owned_ever:
                    plan.targets[tp] = max(plan.targets.get(tp, 0), end)
            reached = {tp: end for tp, end in plan.targets.items() if tp not in owned_ever}
            owned_t1 = sum(plan.targets[tp] for tp in plan.owned)
            if behind is None:  # the gap the first round starts from
                behind = owned_t1 - sum(proc.positions.get((tp.topic, tp.partition), 0) for tp in plan.owned)
            paced = dataclasses.replace(pace, extra={PROCESSOR_COUNT: p_new}, on_checkpoint=checkpointed)
            history = catchup.history()
            replayed += await rebuild(history, history.task(proc), plan, paced)
            async with pace.lock or contextlib.nullcontext():
                await progress.refresh()
            t2 = sum(proc.positions.get((tp.topic, tp.partition), 0) for tp in plan.owned)
            t1 = sum(progress.position(tp.topic, tp.partition) for tp in plan.owned)
            publish(t2, t1, replayed)
            if t1 - t2 <= HANDOVER_LAG:
                break
            if hold_owner is not None and behind is not None and t1 - t2 > behind * NOT_GAINING and hold_owner():
                log.info("%s: processor %d does not gain on its keys' owner (%d records behind, %d a round "
                         "before): the owner's partitions here wait until it caught up", by, proc.id, t1 - t2,
                         behind)  # fmt: skip
                hold_owner = None
            behind = t1 - t2
    except asyncio.CancelledError:
        raise
    except HistoryTruncatedError as exc:  # the job goes on as it is; the scale change waits
        log.error("%s: the scale change cannot go on: %s", by, exc)
        report({"truncated": 1})
        return None
    except Exception:
        log.exception("%s: the bootstrap of processor %d failed; it is retried at the next rebalance", by, proc.id)
        return None
    try:
        stepped = await publish_job(io, job.stepped(by=by))
    except ConcurrentJobChangeError as exc:
        log.warning("processor %d caught up but the job changed meanwhile: %s", proc.id, exc)
        return None
    log.info("processor %d caught up (%d records replayed, %d behind): job epoch %d has %d processors",
             proc.id, replayed, max(0, t1 - t2), stepped.epoch, stepped.p)  # fmt: skip
    return stepped
