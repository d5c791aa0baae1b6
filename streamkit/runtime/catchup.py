"""Catching a hosted processor's state up before its partitions deliver anything.

A member that takes a processor whose store is behind the group (new on this machine,
or an old copy) rebuilds it from the whole history of its keys, without output; one
that takes a processor with keys still below a seal in partitions it no longer reads
reads those first (``rebuild.plan_left_history``). Both are ``rebuild.rebuild`` with a
plan; :class:`CatchUp` holds what they read with, so that the member passes only the
processor, the counts and its checkpoint stamp.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from assignors.group import TopicShape
from streamkit.app import HandlerSpec
from streamkit.checkpoint_keys import PROCESSOR_COUNT
from streamkit.kafkaio import KafkaIO
from streamkit.layout.model import PartitionMode, TopicLayout
from streamkit.layout.registry import LayoutRegistry
from streamkit.runtime import checkpointing
from streamkit.runtime.dispatch import Dispatcher
from streamkit.runtime.processor import ProcessorState
from streamkit.runtime.progress import ProgressLog
from streamkit.runtime.rebuild import HistoryReader, Pace, RebuildPlan, plan_left_history, plan_rebuild, rebuild

__all__ = ["CatchUp", "Stamp", "shape_of"]

log = logging.getLogger(__name__)

Stamp = checkpointing.Stamp
"""The layout epochs and generation a checkpoint is stamped with, read when it is taken."""


def shape_of(layout: TopicLayout) -> TopicShape:
    """What placement needs of a topic's layout."""
    draining = tuple(p for p in range(layout.physical) if layout.mode(p) == PartitionMode.READ_ONLY)
    swept = tuple(p for p in range(layout.physical) if layout.mode(p) == PartitionMode.NONE)
    return TopicShape(layout.n0, layout.active, draining, layout.epoch, swept)


@dataclass(frozen=True)
class CatchUp:
    """Reads history into a member's processors (see the module docstring)."""

    name: str
    """The member, in log lines."""
    io: KafkaIO
    registry: LayoutRegistry
    progress: ProgressLog
    handlers: Mapping[str, list[HandlerSpec]]
    input_topics: Sequence[str]
    dispatcher: Dispatcher
    group: str
    commit_every: int
    """A rebuild checkpoints every this many records (a restart goes on from there)."""
    send_output: Callable[[], Awaitable[None]]
    """Flush what the handlers emitted, before a checkpoint."""

    def history(self) -> HistoryReader:
        """What a rebuild of one of the member's processors reads through and applies with."""
        return HistoryReader(self.io, self.registry, self.handlers, self.dispatcher, self.group,
                             self.progress.sweep_ends)  # fmt: skip

    async def topics(self) -> dict[str, tuple[TopicLayout | None, int]]:
        """Per input topic: its layout (None: a plain topic) and physical partition count."""
        return {t: (self.registry.get(t), await self.io.partition_count(t) or 0) for t in self.input_topics}

    async def shapes(self) -> dict[str, TopicShape]:
        """Per input topic, its shape (a plain topic: all its partitions active)."""
        topics = await self.topics()
        return {t: shape_of(lay) if lay is not None else TopicShape(n, n) for t, (lay, n) in topics.items()}

    async def read_left_history(
        self,
        proc: ProcessorState,
        stamp: Stamp,
        p0: int,
        p: int,
        owned: Iterable[tuple[str, int]],
        handled: Mapping[tuple[str, int], int] | None = None,
    ) -> None:
        """Read what ``proc`` still lacks of partitions it does not consume (``owned``:
        those it does; ``plan_left_history``). What lies above the seals known so far is
        left for a call once the next seal is known: the member calls again on every layout
        change, before the gates (which hold its own partitions until that seal) open."""
        left = plan_left_history(
            proc.id, p0, p, proc.positions, set(owned), {t: self.registry.get(t) for t in self.handlers}, handled
        )
        if left.targets:
            await self.rebuild(proc, stamp, p0, p, left)

    async def rebuild(
        self, proc: ProcessorState, stamp: Stamp, p0: int, p: int, left: RebuildPlan | None = None
    ) -> None:
        """Bring a processor whose store is behind the group up to where the group is: from
        the whole history of its keys, without output (``rebuild``). With ``left``: read
        what it still lacks of partitions it no longer consumes, with output where the
        group had not handled them."""
        started = time.monotonic()
        if left is None:
            topics = await self.topics()
            where = lambda t, q: self.progress.position(t, q, proc.id)  # noqa: E731
            plan = await plan_rebuild(self.io, proc.id, p0, p, topics, where)
            what = "is behind the group here: rebuilding it from %d partitions (up to %d records) without output"
        else:  # no checkpoint before the end: a restart reads it again (a rebuild would emit nothing)
            plan = left
            what = "still has keys in %d partitions it does not read (up to %d records): reading them first"
        log.info("%s: processor %d " + what, self.name, proc.id, len(plan.targets), plan.records)
        pace = Pace(
            stamp, self.commit_every if left is None else 1 << 62, {PROCESSOR_COUNT: p},
            before_checkpoint=self.send_output,
        )  # fmt: skip
        history = self.history()
        read = await rebuild(history, history.task(proc), plan, pace)
        log.info(
            "%s: processor %d rebuilt from %d records in %.1f s", self.name, proc.id, read, time.monotonic() - started
        )
