"""A shrink's staging store started from the changelogs of the two processors it merges.

Shrinking from ``p`` to ``p - 1`` gives the retiring processor R's keys back to the
receiving processor S, whose staging store must hold both key sets for ``p - 1``
processors with one input position per partition (``scaling``). Each changelog head
holds one key set at its own positions (P_S, P_R), so the two are first brought to common
positions X (per partition, the furthest either got, IC ranges included):

1. read each changelog's chain to its head, keeping that processor's keys;
2. for each, in a scratch store beside the staging one: the head's state and checkpoint,
   then the input from the head's positions up to X with that key set's filter, without
   output (``rebuild``): an input record below a head's positions is never read;
3. both reached X (else the input history is read instead, said in one line): their
   states, the positions and the strays seen go into the staging store in one batch,
   marked as a rebuild in progress for ``p - 1``; the scratch stores are deleted.

The bootstrap then goes on from X as a growth bootstrap goes on from its seed. A kill at
any step leaves an empty staging store (the seed is done again) or the whole seed.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from assignors.linear_hashing import bucket_modulus
from stores.base import Checkpoint
from streamkit.checkpoint_keys import CHANGELOG_POSITION, PROCESSOR_COUNT, RETIRED
from streamkit.runtime.catchup import CatchUp
from streamkit.runtime.checkpointing import Stamp
from streamkit.runtime.processor import SEEN_STRAYS, STREAM_TIME, ProcessorState, StateMemory
from streamkit.runtime.rebuild import REBUILD_MARK, Pace, plan_rebuild, rebuild
from streamkit.runtime.sides import SIDES, SideClocks
from streamkit.state.changelog import position_of
from streamkit.state.restore import ChangelogSource, RestorePlan, head_count, keep_own_keys, live_changes, read_plan

__all__ = ["StagingSeed", "wait_logged"]

log = logging.getLogger(__name__)

SOURCE_LOGGED_WAIT = 30.0
"""Seconds a bootstrap waits for the processor it reads the changelog of to have its
store in the changelog (its snapshot after a handover or an adoption) before reading the
input history instead."""

Position = tuple[str, int]


async def wait_logged(source: ProcessorState, wait: float = SOURCE_LOGGED_WAIT) -> bool:
    """Whether ``source``'s store is in the changelog, waiting up to ``wait`` seconds for
    its snapshot."""
    waited = 0.0
    while position_of(source.loaded) is None and waited < wait:
        await asyncio.sleep(0.1)
        waited += 0.1
    return position_of(source.loaded) is not None


@dataclass(frozen=True)
class StagingSeed:
    """What seeding a staging store reads with (see the module docstring)."""

    catchup: CatchUp
    source: ChangelogSource
    """The job's changelog, as it is read."""
    lock: asyncio.Lock
    stamp: Stamp
    memory: StateMemory | None = None

    async def __call__(self, staging: ProcessorState, receiving: ProcessorState | None, retiring: int) -> bool:
        """Seed ``staging`` (processor ``receiving``'s store for the job without processor
        ``retiring``); whether it was (else its bootstrap reads the input history, said in
        one line). A staging store that has positions already is resumed, not seeded."""
        for pid in (staging.id, retiring):  # a kill after a seed's commit left them behind
            shutil.rmtree(scratch_path(staging, pid), ignore_errors=True)
        if staging.loaded.positions:
            return False
        name, src = self.catchup.name, self.source
        count = retiring  # the job shrinks to this many processors
        if receiving is None or not await wait_logged(receiving):
            why = f"processor {staging.id}'s store is not in {self.source.topic} yet"
            log.info("%s: processor %d's staging store is rebuilt from the input history: %s", name, staging.id, why)
            return False
        plans: dict[int, RestorePlan] = {}
        for pid in (staging.id, retiring):
            plan, _ = await read_plan(src.io, src.topic, pid, incarnation=src.incarnation, log_as=name)
            if plan is None or not holds_keys(pid, src.p0, head_count(plan, src.p0), count + 1):
                why = f"processor {pid} has no chain of markers for {count + 1} processors in {self.source.topic}"
                log.info(
                    "%s: processor %d's staging store is rebuilt from the input history: %s", name, staging.id, why
                )
                return False
            keep_own_keys(plan, pid, src.p0, self._windowed(), count + 1)
            plans[pid] = plan
        common = aligned_positions(plans.values())
        if (behind := await self._group_behind(common)) is not None:
            log.info("%s: processor %d's staging store is rebuilt from the input history: the group is still at %s",
                     name, staging.id, behind)  # fmt: skip
            return False
        parts: list[ProcessorState] = []
        read = 0
        try:
            try:
                for pid, plan in plans.items():
                    parts.append(await self._scratch(staging, pid, plan, count + 1))
                    read += await self._read_to(parts[-1], common, count + 1)
                merged = merge_states(parts)
            except SeedShortError as exc:
                merged = str(exc)
            if isinstance(merged, str):
                log.info("%s: processor %d's staging store is rebuilt from the input history: %s",
                         name, staging.id, merged)  # fmt: skip
                return False
            self._commit(staging, parts, merged, count)
        finally:
            for scratch in parts:
                scratch.close()
            for pid in plans:
                shutil.rmtree(scratch_path(staging, pid), ignore_errors=True)
        log.info(
            "%s: processor %d's staging store seeded from the changelogs of processors %s: %d keys; "
            "%d input records read to bring them to the same positions; input from %s",
            name, staging.id, sorted(plans), sum(len(t) for t in merged.values()), read,
            {f"{t}[{q}]": o for (t, q), o in sorted(staging.positions.items())},
        )  # fmt: skip
        return True

    async def _group_behind(self, common: Mapping[Position, int]) -> str | None:
        """None once the group's position (the lowest sharer's, for a shared partition) is
        at or past ``common`` everywhere, waiting up to ``SOURCE_LOGGED_WAIT`` for it; else
        where it still is. A staging store must never hold a key set further than the
        group has handled it: its processor's records below would go without output."""
        progress = self.catchup.progress
        waited = 0.0
        while True:
            async with self.lock:
                await progress.refresh()
            short = {tp: pos for tp, at in common.items() if (pos := progress.position(*tp)) < at}
            if not short or waited >= SOURCE_LOGGED_WAIT:
                return None if not short else ", ".join(f"{t}[{q}] {o}" for (t, q), o in sorted(short.items()))
            await asyncio.sleep(0.2)
            waited += 0.2

    def _windowed(self) -> list[str]:
        return [name for name, t in self.source.tables.items() if t.window is not None]

    async def _scratch(self, staging: ProcessorState, pid: int, plan: RestorePlan, count: int) -> ProcessorState:
        """A scratch store of processor ``pid``'s keys at its changelog head."""
        path = scratch_path(staging, pid)
        shutil.rmtree(path, ignore_errors=True)
        tables = self.source.tables
        scratch = await ProcessorState.open(pid, path, tables, 5.0, self.source.incarnation, memory=self.memory)
        head = plan.head.checkpoint
        scratch.store.commit(live_changes(plan, tables), head.replace(extra=seed_marks(head, count)))
        scratch.reload()
        return scratch

    async def _read_to(self, scratch: ProcessorState, common: Mapping[Position, int], count: int) -> int:
        """Apply ``scratch``'s keys of the input from its positions up to ``common``; the
        records read. Raises if it could not get there (a gate held it)."""
        c = self.catchup
        plan = await plan_rebuild(
            c.io, scratch.id, self.source.p0, count, await c.topics(), lambda t, q: common.get((t, q), 0)
        )
        history = c.history()
        pace = Pace(self.stamp, 1 << 62, {PROCESSOR_COUNT: count}, self.lock)
        read = await rebuild(history, history.task(scratch), plan, pace)
        positions, ranges = scratch.stable()
        short = {
            f"{tp.topic}[{tp.partition}]": (positions.get((tp.topic, tp.partition), 0), end)
            for tp, end in plan.targets.items()
            if positions.get((tp.topic, tp.partition), 0) < end
        }
        if short or any(ranges.values()):
            raise SeedShortError(f"processor {scratch.id}'s keys did not reach the common positions: {short or ranges}")
        return read

    def _commit(
        self, staging: ProcessorState, parts: list[ProcessorState], merged: dict[str, dict[bytes, bytes]], count: int
    ) -> None:
        epochs, generation = self.stamp()
        positions: dict[Position, int] = {}
        seen: dict[str, int] = {}
        for part in parts:
            for tp, at in part.positions.items():
                positions[tp] = max(positions.get(tp, 0), at)
            for origin, at in part.seen_strays.table_at(*part.stable()).items():  # copies go in origin order
                seen[origin] = max(seen.get(origin, -1), at)
        extra = staging.checkpoint_extra({PROCESSOR_COUNT: count, REBUILD_MARK: True})
        if staging.windows:  # one stream time per key set until the merged processor goes live
            extra[STREAM_TIME] = max(p.stream_time for p in parts)
            extra[SIDES] = SideClocks(self.source.p0, count + 1, {p.id: p.stream_time for p in parts}).to_extra()
        if seen:
            extra[SEEN_STRAYS] = seen
        staging.store.commit(
            merged, Checkpoint(positions=positions, layout_epochs=dict(epochs), generation=generation, extra=extra)
        )
        staging.reload()


def seed_marks(head: Checkpoint, count: int) -> dict[str, Any]:
    """The extra of a store seeded from a changelog ``head`` for ``count`` processors: the
    head's, off the changelog (the store is not on its chain), marked as a rebuild in
    progress (the bootstrap reads the input from there). Not the processors retired into
    the head's processor (``RETIRED``): those are its own to announce."""
    kept = {k: v for k, v in head.extra.items() if k not in (CHANGELOG_POSITION, RETIRED)}
    return kept | {PROCESSOR_COUNT: count, REBUILD_MARK: True}


class SeedShortError(Exception):
    """A scratch store could not be brought to the common positions."""


def holds_keys(pid: int, p0: int, held: int, count: int) -> bool:
    """Whether processor ``pid``'s store for ``held`` processors holds all its keys for
    ``count``: it existed then, and none of them had moved away (linear hashing: a key set
    only shrinks as the count grows past its processor's split)."""
    return held > pid and bucket_modulus(pid, p0, count) >= bucket_modulus(pid, p0, held)


def scratch_path(staging: ProcessorState, pid: int) -> Path:
    store = Path(str(staging.store.path))
    return store.with_name(f"{store.name}.seed-{pid}")


def aligned_positions(plans: Iterable[RestorePlan]) -> dict[Position, int]:
    """Per partition, the furthest position of the heads of ``plans``, IC ranges included:
    where both key sets are brought before they are merged."""
    common: dict[Position, int] = {}
    for plan in plans:
        head = plan.head.checkpoint
        for tp, at in head.positions.items():
            ends = [last + 1 for _, last in head.ic_ranges.get(tp, ())]  # inclusive ranges
            common[tp] = max(common.get(tp, 0), at, *ends)
    return common


def merge_states(parts: list[ProcessorState]) -> dict[str, dict[bytes, bytes]] | str:
    """The tables of ``parts`` in one batch, or why they cannot be merged (a key both
    hold: a table keyed otherwise than by the records' keys)."""
    merged: dict[str, dict[bytes, bytes]] = {}
    for part in parts:
        for table in part.caches:
            into = merged.setdefault(table, {})
            for key, value in part.store.items(table):
                if key in into:
                    return f"table {table!r} holds key {key!r} in both processors' states"
                into[key] = value
    return merged
