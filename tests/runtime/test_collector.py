"""The worker's garbage-collector setting (pure: the interpreter's own collector)."""

from __future__ import annotations

import gc

from streamkit.runtime.collector import fewer_collections


def test_nested_workers_share_the_threshold_and_the_last_restores_it() -> None:
    found = gc.get_threshold()
    with fewer_collections(50_000):
        assert gc.get_threshold()[0] == 50_000 and gc.get_freeze_count() > 0
        with fewer_collections(20_000):
            assert gc.get_threshold()[0] == 50_000  # never lowered by a second worker
        assert gc.get_threshold()[0] == 50_000
    assert gc.get_threshold() == found and gc.get_freeze_count() == 0


def test_none_leaves_the_collector_alone() -> None:
    found = gc.get_threshold()
    with fewer_collections(None):
        assert gc.get_threshold() == found and gc.get_freeze_count() == 0
