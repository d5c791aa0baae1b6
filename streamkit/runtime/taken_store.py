"""A processor's store when a member takes the processor: the one on this disk, unless
the changelog holds more of it.

- No store on this disk (a lost disk, a new machine): it is restored from the changelog.
- A store on this disk behind a later owner's checkpoint (the processor ran elsewhere
  since: ``ChangelogWriter.later_owner``), judged as it is on disk, before its keys are
  fitted to the job's processor count: it is set aside and restored from the changelog.
  Taken as it was, it would be brought forward from the input, without output, only up to
  the group's position, which lags a checkpoint whose owner died before recording its
  positions; the output and sink rows that checkpoint had sent would be sent again.

A changelog with no chain of the processor leaves a lost store to be rebuilt from the
input (``catchup``), and a store set aside is taken back as it was.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

from streamkit.runtime.key_sets import StoreOpening, open_for_count
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.status import Restores
from streamkit.state.changelog import ChangelogWriter, position_of
from streamkit.state.restore import ChangelogSource, restore_store

__all__ = ["open_taken"]

log = logging.getLogger(__name__)

Restore = Callable[[], Awaitable[bool]]
"""Restore the processor's store from the changelog; whether it was (else nothing written)."""


async def open_taken(
    pid: int,
    path: Path,
    changelog: ChangelogWriter | None,
    source: ChangelogSource,
    opening: StoreOpening,
    count: int,
    *,
    log_as: str,
    restores: Restores,
) -> ProcessorState:
    """Processor ``pid``'s store at ``path`` for ``count`` processors (see the module
    docstring); ``restores``: where a restore's progress is shown."""

    async def restore() -> bool:
        try:
            return await restore_store(source, pid, path, log_as=log_as, on_read=restores.tracker(pid)) is not None
        finally:
            restores.done(pid)

    if changelog is not None:
        await _restore_if_behind(pid, path, changelog, opening, restore, log_as)
        if not path.exists():
            await restore()
    return await open_for_count(pid, path, opening, source.p0, count, log_as=log_as, adopt=True)


async def _restore_if_behind(
    pid: int, path: Path, changelog: ChangelogWriter, opening: StoreOpening, restore: Restore, log_as: str
) -> None:
    """The store on this disk, as it is there (before its keys are fitted to the count),
    restored from the changelog if a later owner's checkpoint is beyond it; kept aside
    until the restore is done, and taken back if the changelog has no chain of it."""
    aside = path.with_name(f"{path.name}.behind")
    if aside.exists():  # a crash during the last one: the restore again (done: the restored store is taken)
        if path.exists():
            shutil.rmtree(aside)
        else:
            aside.rename(path)
    if not path.exists():
        return
    stored = await opening.open(pid, path)
    try:
        later = None if position_of(stored.loaded) is None else await changelog.later_owner(pid, stored.loaded)
        generation = stored.loaded.generation
    finally:
        stored.close()
    if later is None:
        return
    log.info(
        "%s: processor %d's store on this disk is behind a later owner's checkpoint (generation %d, changelog "
        "offset %d; the store's generation %d): restored from the changelog",
        log_as, pid, later.generation, later.start, generation,
    )  # fmt: skip
    path.rename(aside)
    if await restore():
        shutil.rmtree(aside)
        return
    shutil.rmtree(path, ignore_errors=True)
    aside.rename(path)
    log.warning("%s: processor %d: the changelog has no chain of it: the store on this disk is taken as it is",
                log_as, pid)  # fmt: skip
