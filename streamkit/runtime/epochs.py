"""Records stamped with a newer layout epoch than a route knows: the layout is re-read
before they are admitted (KIP-232's rule). An epoch the registry does not reach within
its wait (a record mirrored from another cluster, or forged) must not stop the
partition for good: the epoch is recorded as unknown, and admission dead-letters its
records with reason ``unknown-epoch`` while the partition goes on. A registry that was
only slow is asked again after ``UNKNOWN_FOR`` seconds."""

from __future__ import annotations

import logging
import time

from streamkit.layout.registry import LayoutRegistry, StaleLayoutError
from streamkit.runtime.admission import Admission

__all__ = ["UNKNOWN_FOR", "catch_up_epochs"]

log = logging.getLogger(__name__)

UNKNOWN_FOR = 60.0
"""Seconds an epoch the registry did not reach stays unknown before it is asked for again."""


async def catch_up_epochs(admission: Admission, registry: LayoutRegistry) -> bool:
    """Re-read the layouts whose newer epochs records named since the last call; returns
    whether any was named (the routes must then be gated again)."""
    stale = admission.take_stale_epochs()
    for topic, epoch in stale.items():
        try:
            await registry.ensure_at_least(topic, epoch)
        except StaleLayoutError as exc:
            log.warning("%s: %s; its records are dead letters (reason unknown-epoch)", admission.name, exc)
            admission.unknown_epochs.setdefault(topic, {})[epoch] = time.monotonic() + UNKNOWN_FOR
    return bool(stale)
