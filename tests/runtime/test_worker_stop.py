"""A stop is not held up by a member waiting for records.

During a rebalance aiokafka's ``getmany`` waits for the new assignment, whatever its
timeout; the layout soak test once saw a worker still running 30 s after SIGTERM that
way.  Here, once the worker has handled its input, its member's ``getmany`` is made to
wait for ever, as it would for a rebalance that does not end; the stop must still end
``run()`` and checkpoint.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import streamkit
from stores.rocksdb import RocksDBStore
from streamkit.runtime.worker import Worker
from streamkit.testing import create_topic, produce_json

HANG_GUARD_S = 60  # only so that a regression fails instead of hanging the suite


def test_a_stop_does_not_wait_for_a_member_stuck_in_getmany(broker: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    topic = create_topic(broker, f"stop-{tag}", 1)
    produce_json(broker, topic, [(f"k{i % 3}", {"n": 1}) for i in range(30)])
    app = streamkit.App(
        f"stop-{tag}",
        broker=broker,
        state_dir=tmp_path,
        commit_interval=60,
        session_timeout_ms=4000,
        heartbeat_interval_ms=400,
    )
    totals = app.table("totals", default=int)
    handled: list[int] = []

    @app.processor(app.topic(topic))
    def handle(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        totals[key] += value["n"]
        handled.append(ctx.offset)

    async def scenario() -> None:
        worker = Worker(app, 1)
        task = asyncio.create_task(worker.run())
        while len(handled) < 30:
            assert not task.done(), "the worker stopped early"
            await asyncio.sleep(0.05)
        member = worker.members[0]
        stuck = asyncio.Event()

        async def waits_for_ever(*args: Any, **kwargs: Any) -> dict[Any, Any]:
            stuck.set()
            await asyncio.Event().wait()
            return {}

        member.consumer.getmany = waits_for_ever  # type: ignore[method-assign]
        await stuck.wait()
        assert member.awaiting_records
        worker.stop()
        async with asyncio.timeout(HANG_GUARD_S):
            await task

    asyncio.run(scenario())
    # the stop checkpointed (commit_interval is 60 s: no checkpoint had run before)
    with RocksDBStore.open(str(app.store_path(0, tmp_path)), ["totals"]) as store:
        assert store.checkpoint().positions == {(topic, 0): 30}
        assert {k.decode(): v for k, v in store.items("totals")} == {"k0": b"10", "k1": b"10", "k2": b"10"}


def test_the_heartbeat_ends_when_cancelled_just_after_a_checkpoint_woke_it() -> None:
    """A member's checkpoint wakes the heartbeat (``services.beat``); a stop that cancels the
    heartbeat in the next few loop iterations must end it. Python 3.11's ``wait_for``
    returned instead of raising there (its inner wait had finished), so the heartbeat
    looped on, and the worker, waiting for it, never stopped: seen once in CI."""

    async def still_running_after_cancel(iterations_after_beat: int) -> bool:
        worker = Worker.__new__(Worker)  # only what _heartbeat touches
        worker._beat = asyncio.Event()

        async def publish(alive: bool = True) -> None:
            pass

        worker._publish_status = publish  # type: ignore[method-assign]
        heartbeat = asyncio.create_task(worker._heartbeat())
        for _ in range(5):  # into its wait for the next beat
            await asyncio.sleep(0)
        worker._beat.set()
        for _ in range(iterations_after_beat):
            await asyncio.sleep(0)
        heartbeat.cancel()
        done, _ = await asyncio.wait([heartbeat], timeout=1)
        heartbeat.cancel()
        return not done

    async def scenario() -> list[int]:
        return [n for n in range(6) if await still_running_after_cancel(n)]

    assert asyncio.run(scenario()) == [], "the heartbeat outlived its cancellation"
