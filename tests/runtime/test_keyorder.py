"""The key-level scheduler alone (pure asyncio): concurrency across keys, order per key,
the time budget, and back-pressure at the pending cap."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from streamkit.runtime.keyorder import KeyScheduler


@dataclass(frozen=True)
class Rec:
    offset: int
    key: bytes


def test_records_of_different_keys_overlap_and_each_keys_records_keep_their_order() -> None:
    sched = KeyScheduler(limit=8, max_pending=1_000)
    recs = [Rec(o, b"k%d" % (o % 20)) for o in range(200)]
    sched.submit(recs)
    seen: dict[bytes, list[int]] = {}
    running = 0
    most = 0

    async def handle(rec: Rec) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.001 * (rec.offset % 3))
        seen.setdefault(rec.key, []).append(rec.offset)
        running -= 1

    asyncio.run(sched.run(handle, budget=60))
    assert most == 8 and sched.most_running == 8
    assert not sched.pending and not sched.queued
    assert all(offsets == sorted(offsets) for offsets in seen.values())
    assert sum(map(len, seen.values())) == 200


def test_run_returns_with_none_running_and_leaves_the_rest_queued_and_pending() -> None:
    sched = KeyScheduler(limit=2, max_pending=1_000)
    sched.submit([Rec(o, b"hot") for o in range(50)] + [Rec(50, b"other")])

    async def handle(rec: Rec) -> None:
        await asyncio.sleep(0.002)

    asyncio.run(sched.run(handle, budget=0.01))
    assert sched.queued and 50 not in sched.pending  # the other key finished
    assert 0 not in sched.pending and 49 in sched.pending  # the hot key is part-way


def test_beyond_the_pending_cap_run_goes_on_until_it_is_back_under() -> None:
    sched = KeyScheduler(limit=4, max_pending=10)
    sched.submit([Rec(o, b"k%d" % (o % 4)) for o in range(100)])

    async def handle(rec: Rec) -> None:
        await asyncio.sleep(0)

    asyncio.run(sched.run(handle, budget=0))
    assert len(sched.pending) <= 10
