"""The wait a worker's producer makes before acknowledging a layout change (pure logic;
the proof with real processes is tests/runtime/test_strays_expansions.py, whose worker
looks at layouts seldom enough to read past a seal it has not learnt of)."""

from __future__ import annotations

import asyncio

from streamkit.layout import transitions
from streamkit.runtime.adoption import HOLD_LIMIT_MS, LayoutAdoptions, holding


def test_the_wait_ends_when_every_member_reading_the_topic_has_taken_the_epoch() -> None:
    async def scenario() -> tuple[bool, list[str], bool]:
        adoptions = LayoutAdoptions()
        adoptions.register("m0", ["in"])
        adoptions.register("m1", ["in"])
        adoptions.register("other", ["elsewhere"])  # does not read the topic: not waited for
        adoptions.adopted("m0", "in", 3)
        waiting = asyncio.create_task(adoptions.wait("in", 3, timeout=30))
        await asyncio.sleep(0)
        behind = adoptions.behind("in", 3)
        early = waiting.done()
        adoptions.adopted("m1", "in", 2)  # an older epoch: still waiting
        await asyncio.sleep(0)
        assert not waiting.done()
        adoptions.adopted("m1", "in", 3)
        async with asyncio.timeout(5):
            taken = await waiting
        return taken, behind, early

    taken, behind, early = asyncio.run(scenario())
    assert taken and behind == ["m1"] and not early


def test_a_member_that_never_takes_the_epoch_delays_the_ack_by_the_timeout_only() -> None:
    async def scenario() -> tuple[bool, bool]:
        adoptions = LayoutAdoptions()
        adoptions.register("m0", ["in"])
        late = await adoptions.wait("in", 1, timeout=0.05)
        adoptions.unregister("m0")  # a stopped member is not waited for
        return late, await adoptions.wait("in", 1, timeout=30)

    assert asyncio.run(scenario()) == (False, True)


def test_routes_hold_an_announced_change_only_for_a_while() -> None:
    """A coordinator that dies before its seal does not stop the altered partitions for
    longer than ``HOLD_LIMIT_MS`` (``topics resume`` seals its change later)."""
    lay = transitions.create("t", 4, capacity=8, now_ms=0)
    assert not holding(lay, now_ms=1)
    lay = transitions.expand(lay, 6, announce_offsets={p: 0 for p in range(8)}, now_ms=1000)
    assert holding(lay, now_ms=1000 + HOLD_LIMIT_MS - 1)
    assert not holding(lay, now_ms=1000 + HOLD_LIMIT_MS)
    assert not holding(transitions.seal(lay, {p: 0 for p in range(8)}), now_ms=1001)
