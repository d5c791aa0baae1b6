"""Holes in fetch answers: asked for again, read past only when they stay.

Tansu (memory engine) sometimes answers a fetch without some batches while producers
write the partition (the layout soak test lost one record to it); asked again, they are
there.  Here the real broker's answers pass through a filter that takes records out,
once (the race) or every time (a real hole, as compaction leaves), and a worker in this
process must apply exactly the records the log holds, in order.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

import streamkit
from streamkit.runtime.worker import Worker
from streamkit.testing import create_topic, produce_json
from tests.runtime.test_app_api import run_until

LEFT_OUT = range(40, 60)


@pytest.mark.parametrize("stays", [False, True], ids=["race", "real-hole"])
def test_records_left_out_of_a_fetch_answer(
    broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stays: bool
) -> None:
    tag = uuid.uuid4().hex[:8]
    topic = create_topic(broker, f"holes-{tag}", 1)
    produce_json(broker, topic, [(f"k{i % 5}", {"i": i}) for i in range(200)])
    app = streamkit.App(
        f"holes-{tag}",
        broker=broker,
        state_dir=tmp_path,
        commit_interval=0.2,
        session_timeout_ms=4000,
        heartbeat_interval_ms=400,
    )
    source = app.topic(topic)
    handled: list[int] = []
    left_out: list[int] = []
    real_getmany = AIOKafkaConsumer.getmany

    async def leaky_getmany(self: AIOKafkaConsumer, *partitions: Any, **kw: Any) -> dict[Any, list[Any]]:
        answer = await real_getmany(self, *partitions, **kw)
        for tp, recs in answer.items():
            if tp.topic == topic and (stays or not left_out) and any(r.offset in LEFT_OUT for r in recs):
                left_out.extend(r.offset for r in recs if r.offset in LEFT_OUT)
                answer[tp] = [r for r in recs if r.offset not in LEFT_OUT]
        return answer

    monkeypatch.setattr(AIOKafkaConsumer, "getmany", leaky_getmany)

    @app.processor(source)
    def handle(key: str, value: dict[str, Any], ctx: streamkit.Context) -> None:
        handled.append(ctx.offset)

    expected = [i for i in range(200) if not (stays and i in LEFT_OUT)]
    worker = Worker(app, 1)
    asyncio.run(run_until(worker, lambda: len(handled) >= len(expected) and handled[-1] == 199, timeout=30))
    assert left_out, "the filter never saw the records it should leave out"
    assert handled == expected
    assert worker.members[0].admission.holes_refetched == 1
