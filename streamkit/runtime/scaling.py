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
import logging
import re
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from aiokafka import TopicPartition

from assignors.linear_hashing import bucket_modulus, lh_bucket
from assignors.murmur2 import key_hash
from stores.rocksdb import RocksDBStore
from streamkit.app import HandlerSpec
from streamkit.errors import HistoryTruncatedError
from streamkit.kafkaio import KafkaIO
from streamkit.layout.model import TopicLayout
from streamkit.layout.registry import LayoutRegistry
from streamkit.runtime.dispatch import Dispatcher
from streamkit.runtime.jobmeta import Bootstrap, ConcurrentJobChangeError, JobLayout, publish_job
from streamkit.runtime.processor import ProcessorState, StateMemory
from streamkit.runtime.progress import ProgressLog
from streamkit.runtime.rebuild import REBUILD_MARK, plan_rebuild, rebuild
from streamkit.runtime.staging_seed import wait_logged
from streamkit.state.changelog import CHANGELOG_POSITION, unlogged
from streamkit.state.restore import live_changes, seed_plan
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
    loaded = unlogged(loaded)  # written past the changelog: the store's next checkpoint is a snapshot
    proc.store.commit(deletes, loaded.replace(extra={**loaded.extra, "p": p}))
    proc.loaded = proc.store.checkpoint()
    for cache in proc.caches.values():
        cache.invalidate()
    return sum(len(d) for d in deletes.values())


def adopt_windows(joined: ProcessorState, old: ProcessorState, tables: Mapping[str, Table], p0: int, p: int) -> int:
    """At an in-place handover, both stores at T1: the joined processor's windowed tables
    and books, for its keys, become the old owner's. Returns how many entries it took.

    The joined processor rebuilt them from its own partitions' records, on its own stream
    time; the old owner applied the same records interleaved with its other partitions',
    on a stream time that may have been ahead. Where the two differ, the old owner's are
    what was sent: a window it closed and sent stays closed (rebuilt, it could still be
    open, take the records the old owner judged late, and be sent a second time), and a
    record it judged late stays out. The store is written past its changelog: its next
    checkpoint is a snapshot (as ``purge_moved_keys``).

    Only when the two stores applied the same records: the same stable offsets on every
    partition the joined processor rebuilt, and no individually committed records beyond
    them on either side (a key-concurrent route's, which the joined processor applies
    again after the handover). Otherwise its rebuilt windows stay, as before."""
    mine_at, old_at = joined.loaded.positions, old.loaded.positions
    if (
        not mine_at
        or any(old_at.get(key) != at for key, at in mine_at.items())
        or any(joined.loaded.ic_ranges.values())
        or any(old.loaded.ic_ranges.values())
    ):
        log.info(
            "processor %d keeps its rebuilt windows: its store and processor %d's did not apply the same records "
            "(positions %s and %s)",
            joined.id, old.id, dict(mine_at), {k: old_at.get(k) for k in mine_at},
        )  # fmt: skip
        return 0
    changes: dict[str, dict[bytes, bytes | None]] = {}
    for name, table in tables.items():
        if table.window is None:
            continue
        mine: dict[bytes, bytes | None] = {stored: None for stored, _ in joined.store.items(name)}
        for stored, value in old.store.items(name):
            if lh_bucket(key_hash(stored[:-8]), p0, p) == joined.id:
                mine[stored] = value
        if mine:
            changes[name] = mine
    if not changes:
        return 0
    loaded = unlogged(joined.loaded)
    joined.store.commit(changes, loaded)
    joined.loaded = joined.store.checkpoint()
    for cache in joined.caches.values():
        cache.invalidate()
    for state in joined.window_states.values():
        state.reindex()
    return sum(1 for per in changes.values() for v in per.values() if v is not None)


STAGING_SUFFIX = ".receiving"
"""The staging store of a shrink's receiving processor sits beside its store, so named."""


def staging_path(store: Path) -> Path:
    return store.with_name(store.name + STAGING_SUFFIX)


def store_positions(path: Path) -> dict[tuple[str, int], int]:
    """The positions of the store at ``path`` if it exists and nobody holds it (else none)."""
    try:
        with RocksDBStore.open(str(path), create=False) as store:
            return dict(store.checkpoint().positions)
    except Exception:  # noqa: BLE001 - none, or held by a worker: from the start
        return {}


def stored_count(proc: ProcessorState, p0: int) -> int | None:
    """The processor count the store's key set is for (None: an empty store)."""
    extra = proc.loaded.extra
    if "p" in extra:
        return int(extra["p"])
    if "backfill" in extra:  # a store that a backfill built, not opened since
        return int(extra["backfill"]["processors"])
    return None if proc.loaded.is_empty() else p0


def key_set_change(pid: int, p0: int, stored: int | None, count: int) -> str | None:
    """How processor ``pid``'s keys for ``count`` processors differ from those of a store
    written for ``stored``: "shrank" (some moved away: purge them), "grew" (some came back
    from a retired processor: the store lacks them), or None (the same keys)."""
    if stored is None or stored == count:
        return None
    had, has = bucket_modulus(pid, p0, stored), bucket_modulus(pid, p0, count)
    return None if had == has else ("shrank" if has > had else "grew")


def adopt_store(path: Path, count: int) -> str:
    """Make the store at ``path`` hold its processor's keys for ``count`` processors, when it
    was written for more (the processor receives a retiring one's keys): replace it by its
    staging store if that was built for ``count``, or else empty it (the member rebuilds it
    from the whole history). Call with the store closed; returns what was done."""
    staging = staging_path(path)
    try:
        with RocksDBStore.open(str(staging), create=False) as store:
            ready = store.checkpoint().extra.get("p") == count
    except Exception:  # noqa: BLE001 - none, held (a bootstrap still running) or broken: rebuild
        ready = False
    old = path.with_name(path.name + ".replaced")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)  # a crash from here on leaves no store: rebuilt from the history
    if ready:
        staging.rename(path)
    shutil.rmtree(old, ignore_errors=True)
    return "replaced by its staging store" if ready else "emptied, to be rebuilt"


async def open_for_count(
    pid: int,
    path: Path,
    tables: Mapping[str, Table],
    p0: int,
    count: int,
    *,
    timeout: float,
    log_as: str,
    adopt: bool = False,
    incarnation: str = "",
    app: str = "",
    memory: StateMemory | None = None,
) -> ProcessorState:
    """Open processor ``pid``'s store at ``path`` holding its keys for ``count``
    processors: a store written for fewer loses the keys that moved away; one written for
    more lacks keys that came back: ``adopt`` its staging store, or start it empty."""
    proc = await ProcessorState.open(pid, path, tables, timeout, incarnation, app, memory)
    stored = stored_count(proc, p0)
    change = key_set_change(pid, p0, stored, count)
    if change == "grew":
        proc.close()
        if adopt:
            done = adopt_store(path, count)
        else:
            shutil.rmtree(path)
            done = "emptied, to be rebuilt"
        log.info("%s: processor %d's store was for %d processors, the job has %d: %s",
                 log_as, pid, stored, count, done)  # fmt: skip
        proc = await ProcessorState.open(pid, path, tables, timeout, incarnation, app, memory)
    elif change == "shrank":
        gone = purge_moved_keys(proc, tables, p0, count)
        log.info("%s: processor %d: %d keys moved to new processors, deleted", log_as, pid, gone)
    return proc


def delete_retired_stores(app_dir: Path, hosted: int) -> list[int]:
    """Delete the stores of processors ``>= hosted`` (retired by a shrink) that nobody holds;
    returns their ids."""
    gone = []
    for path in sorted(app_dir.glob("processor-*")):
        m = re.fullmatch(r"processor-(\d+)", path.name)
        if m is None or int(m.group(1)) < hosted:
            continue
        try:
            RocksDBStore.open(str(path), create=False).close()
        except Exception:  # noqa: BLE001 - held by a worker, or not a store: leave it
            continue
        shutil.rmtree(path, ignore_errors=True)
        gone.append(int(m.group(1)))
    return gone


async def seed_from_changelog(
    proc: ProcessorState,
    source: ProcessorState | None,
    *,
    io: KafkaIO,
    topic: str,
    count: int,
    p0: int,
    tables: Mapping[str, Table],
    incarnation: str,
    log_as: str,
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
        plan, why = None, f"processor {source.id}'s store is not in {topic} yet"
    else:
        plan, why = await seed_plan(
            io, topic, source.id, proc.id, tables, p0=p0, count=count, incarnation=incarnation, log_as=log_as
        )
    if plan is None:
        log.info("%s: processor %d bootstraps from the input history: %s", log_as, proc.id, why)
        return False
    head = plan.head.checkpoint
    marks = {k: v for k, v in head.extra.items() if k != CHANGELOG_POSITION} | {"p": count, REBUILD_MARK: True}
    changes = live_changes(plan, tables)
    proc.store.commit(changes, head.replace(extra=marks))
    proc.reload()
    log.info(
        "%s: processor %d seeded from processor %d's changelog: %d keys (%s); input from %s",
        log_as, proc.id, source.id, sum(len(c) for c in changes.values()), why,
        {f"{t}[{p}]": o for (t, p), o in sorted(head.positions.items())},
    )  # fmt: skip
    return True


async def bootstrap_step(
    proc: ProcessorState,
    *,
    job: JobLayout,
    step: Bootstrap,
    io: KafkaIO,
    registry: LayoutRegistry,
    progress: ProgressLog,
    handlers: Mapping[str, list[HandlerSpec]],
    topics: Callable[[], Awaitable[Mapping[str, tuple[TopicLayout | None, int]]]],
    dispatcher: Dispatcher,
    lock: asyncio.Lock,
    stamp: Callable[[], tuple[Mapping[str, int], int]],
    group: str,
    checkpoint_every: int,
    checkpoint_interval: float,
    max_rate: float | None,
    report: Callable[[dict[str, int]], None],
    by: str,
    seed: Callable[[], Awaitable[bool]] | None = None,
) -> JobLayout | None:
    """Rebuild ``proc`` for ``step.count`` processors (``job.bootstrap``) until it is within
    ``HANDOVER_LAG`` records of its keys' owners, then publish the next epoch of the job
    (returned; None if another writer changed the job first, or the bootstrap failed: a
    history that is gone stalls the change, another failure is retried at the next
    rebalance). ``by``: the host, in logs and in the job record. ``seed()``: start the
    store from the changelog first (``seed_from_changelog``; whether it did)."""
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
        while True:
            async with lock:
                await progress.refresh()
            # the input topics as they are now: a layout change between rounds changes S1 and S2
            plan = await plan_rebuild(io, proc.id, job.p0, p_new, await topics(), progress.position)
            # partitions it never owned hold its keys only below seals: a layout change that
            # drops one from S2 leaves it read as far as an earlier round got
            owned_ever |= plan.owned
            for tp, end in reached.items():
                if tp not in owned_ever:
                    plan.targets[tp] = max(plan.targets.get(tp, 0), end)
            reached = {tp: end for tp, end in plan.targets.items() if tp not in owned_ever}
            owned_t1 = sum(plan.targets[tp] for tp in plan.owned)
            replayed += await rebuild(
                io=io, registry=registry, proc=proc, handlers=handlers, plan=plan, dispatcher=dispatcher, stamp=stamp,
                group=group, checkpoint_every=checkpoint_every, extra={"p": p_new}, lock=lock,
                checkpoint_interval=checkpoint_interval, max_rate=max_rate, on_checkpoint=checkpointed,
                sweep_ends=progress.sweep_ends,
            )  # fmt: skip
            async with lock:
                await progress.refresh()
            t2 = sum(proc.positions.get((tp.topic, tp.partition), 0) for tp in plan.owned)
            t1 = sum(progress.position(tp.topic, tp.partition) for tp in plan.owned)
            publish(t2, t1, replayed)
            if t1 - t2 <= HANDOVER_LAG:
                break
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
