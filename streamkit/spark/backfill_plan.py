"""What a backfill's driver runs and publishes, set up by ``plan`` for both modes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from streamkit.app import App
from streamkit.spark.keyless import KeylessInput

if TYPE_CHECKING:
    from streamkit.spark.preflight import ClusterView

__all__ = ["BackfillPlan"]


@dataclass
class BackfillPlan:
    """The shared part of both modes (what the driver needs to run and publish)."""

    app: App
    mode: str
    tables: list[str]  # tables written
    p0: int
    p: int
    subs: int
    num_partitions: int
    state_dir: Path
    positions: dict[tuple[str, int], int]
    derive_positions: bool
    topics: list[str]  # topics the positions must cover
    layout_epochs: dict[str, int]
    allow_partial: bool
    from_start: bool
    fail_at: str | None
    keep_backup: bool
    topic_partitions: dict[str, tuple[int, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    verify_unique: bool = False  # fused mode 1: check that no key was written twice
    first: int = 0
    """The first processor whose store is built (those below belong to a running job)."""
    cluster: ClusterView | None = None
    allow_skipped: bool = False
    """Rows left out (no key, rejected by a handler, undecodable) do not fail the run."""
    rows_in: int = 0
    """Rows in the input (all tables), left-out ones included."""
    left_out: dict[str, int] = field(default_factory=dict)
    """Why -> how many rows the stores do not reflect."""
    incarnation: str = ""
    """The job's incarnation in the cluster, stamped into the stores ("": no cluster)."""
    keyless_inputs: dict[int, KeylessInput] = field(default_factory=dict)
    """Per input (the tag its stage A tasks count under), how to name it in a refusal of
    rows without a key (``keyless``)."""
    stream_times: dict[int, int] = field(default_factory=dict)
    """Per processor, its stream time at the end of the history (windowed tables: the
    largest timestamp of its records; what its store's checkpoint carries)."""
