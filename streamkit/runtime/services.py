"""What a worker's group members share, handed to each of them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from streamkit.connection import Connection
from streamkit.kafkaio import KafkaIO
from streamkit.layout.registry import LayoutRegistry
from streamkit.runtime.adoption import LayoutAdoptions
from streamkit.runtime.jobmeta import JobWatcher
from streamkit.runtime.output import Output
from streamkit.runtime.processor import StateMemory
from streamkit.runtime.progress import ProgressLog
from streamkit.runtime.standbys import StandbyKeeper
from streamkit.state.changelog import ChangelogWriter


@dataclass(frozen=True)
class Services:
    """The worker's shared parts. A member uses these and nothing else of its worker."""

    connection: Connection
    client_id: str
    jobs: JobWatcher
    """The job's record (processor counts, epoch) as last read: ``jobs.job``."""
    io: KafkaIO
    registry: LayoutRegistry
    progress: ProgressLog
    output: Output
    lock: asyncio.Lock
    """One batch, rebalance step or timer at a time, across the worker's members."""
    beat: Callable[[], None]
    """Publish a heartbeat now (after a rebalance or checkpoint), not at the next tick."""
    memory: StateMemory | None = None
    """What the processors' state may use (None: the stores' and caches' own defaults)."""
    plain_partitions: Mapping[str, int] = field(default_factory=dict)
    """The input topics without a layout, and their partition counts at start: where
    their keys belong (``strays.plain_rule``)."""
    changelog: ChangelogWriter | None = None
    """The job's changelog (None: the app has none; ``streamkit.state.changelog``)."""
    standbys: StandbyKeeper | None = None
    """The worker's standby copies (None: the app keeps none; ``runtime.standbys``)."""
    adoptions: LayoutAdoptions = field(default_factory=LayoutAdoptions)
    """The layout epochs the members' routes are gated with (``runtime.adoption``)."""

    @property
    def p0(self) -> int:
        """The job's initial processor count."""
        return self.jobs.job.p0
