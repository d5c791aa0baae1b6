"""The keys of a store checkpoint's ``extra`` (``stores.base.Checkpoint``), in one place:
what each processor's checkpoints, changelog markers and backfilled stores carry besides
positions, IC ranges and epochs."""

from __future__ import annotations

__all__ = [
    "BACKFILL",
    "CHANGELOG_POSITION",
    "INCARNATION",
    "PROCESSOR_COUNT",
    "REBUILD_MARK",
    "RETIRED",
    "SEEN_STRAYS",
    "SIDES",
    "STREAM_TIME",
]

PROCESSOR_COUNT = "p"
"""The job's active processor count the store's keys are placed by."""
INCARNATION = "incarnation"
"""The job incarnation the positions belong to (a reset job starts a new one)."""
STREAM_TIME = "stream_time"
"""The processor's stream time (windows)."""
SEEN_STRAYS = "seen_strays"
"""The forwarded strays applied (``layout.strays.SeenStrays``)."""
CHANGELOG_POSITION = "changelog"
"""The changelog position after the marker of the checkpoint (``state.changelog``)."""
REBUILD_MARK = "rebuild"
"""Present and true while a rebuild of the store has not finished."""
SIDES = "sides"
"""A shrink's merged store: the stream time of each of the two key sets (``runtime.sides``)."""
BACKFILL = "backfill"
"""A store written by a backfill from Spark: what it was written for."""
RETIRED = "retired"
"""Processors a shrink retired into this one (their keys came here) that may still owe
their readers a word: with exactly-once output, this processor's next incarnation
announces each of them as ended (``exactly_once.writer``), then drops the list."""
