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


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_settle_freezes_what_is_alive_and_collects_frozen_cycles_once_they_have_grown() -> None:
    import time
    import weakref

    from streamkit.runtime.collector import THAW_EVERY, THAW_GROWTH, settle

    assert settle() is None and gc.get_freeze_count() == 0  # outside: nothing
    with fewer_collections(50_000):
        start = time.monotonic()
        value = [1, 2]  # a state cache's value: alive at the checkpoint
        garbage = _Cycle()
        gone = weakref.ref(garbage)
        before = gc.get_freeze_count()
        assert settle(start) is None
        assert gc.get_freeze_count() > before  # frozen: no collection walks them now
        del garbage
        gc.collect()
        assert gone() is not None  # a frozen cycle waits for a whole collection
        assert settle(start + THAW_EVERY + 1) is None and gone() is not None  # not grown: none
        grown = [[] for _ in range(int(gc.get_freeze_count() * (THAW_GROWTH - 1)) + 1000)]
        assert settle(start + THAW_EVERY / 2) is None and gone() is not None  # grown, too soon
        found = settle(start + THAW_EVERY + 1)
        assert found is not None and found >= 1 and gone() is None
        assert gc.get_freeze_count() > len(grown) and value == [1, 2]
        assert settle(start + 3 * THAW_EVERY) is None  # measured again after it: not grown since
    assert gc.get_freeze_count() == 0
