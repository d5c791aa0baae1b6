"""A processor's store when a member takes the processor: the one on this disk, unless
the changelog holds more of it.

- No store on this disk (a lost disk, a new machine): it is restored from the changelog.
- A store on this disk behind a later owner's checkpoint (the processor ran elsewhere
  since: ``ChangelogWriter.later_owner``): it is deleted and restored from the changelog.
  Taken as it was, it would be brought forward from the input, without output, only up to
  the group's position, which lags a checkpoint whose owner died before recording its
  positions; the output and sink rows that checkpoint had sent would be sent again.

Either way, a changelog with no chain of the processor leaves the store to be rebuilt
from the input (``catchup``).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from streamkit.runtime.key_sets import StoreOpening, open_for_count
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.status import Restores
from streamkit.state.changelog import ChangelogWriter, position_of
from streamkit.state.restore import ChangelogSource, restore_store

__all__ = ["open_taken"]

log = logging.getLogger(__name__)


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

    async def restore() -> None:
        try:
            await restore_store(source, pid, path, log_as=log_as, on_read=restores.tracker(pid))
        finally:
            restores.done(pid)

    if changelog is not None and not path.exists():
        await restore()
    proc = await open_for_count(pid, path, opening, source.p0, count, log_as=log_as, adopt=True)
    if changelog is None or position_of(proc.loaded) is None:
        return proc
    later = await changelog.later_owner(pid, proc.loaded)
    if later is None:
        return proc
    log.info(
        "%s: processor %d's store on this disk is behind a later owner's checkpoint (generation %d, changelog "
        "offset %d; the store's generation %d): restored from the changelog",
        log_as, pid, later.generation, later.start, proc.loaded.generation,
    )  # fmt: skip
    proc.close()
    shutil.rmtree(path)
    await restore()
    return await open_for_count(pid, path, opening, source.p0, count, log_as=log_as, adopt=True)
