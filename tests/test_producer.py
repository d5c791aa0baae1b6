"""The streamkit producer, used alone (outside an app), on the real broker."""

from __future__ import annotations

import asyncio
import time
import types
import uuid
from typing import Any

import pytest
from aiokafka.record.memory_records import MemoryRecords

from assignors.linear_hashing import lh_bucket
from assignors.murmur2 import kafka_partition, key_hash
from streamkit.kafkaio import KafkaIO
from streamkit.layout import transitions
from streamkit.layout.protocol import LayoutCoordinator
from streamkit.layout.registry import LayoutRegistry
from streamkit.layout.stamps import STAMP_HEADER, record_epoch, record_producer
from streamkit.producer import Producer, ProducerConfig, ProducerFencedError


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def read(broker: str, topic: str, partitions: int) -> dict[int, list]:
    async with KafkaIO(broker) as io:
        return {p: (await io.read(topic, p, 0))[0] for p in range(partitions)}


def test_places_by_layout_stamps_epoch_and_batches(broker: str) -> None:
    topic = name("prod-lay")

    async def go() -> None:
        async with LayoutCoordinator(broker) as co:
            await co.create(topic, 3, capacity=8)
            await co.expand(topic, 5)
        keys = [f"user-{i}" for i in range(500)]
        async with Producer(broker, client_id="alone") as p:
            assert p.layout(topic) is None or p.layout(topic).epoch == 2
            ds = [await p.send(topic, k, {"i": i}) for i, k in enumerate(keys * 20)]
            null = [await p.send(topic, None, b"raw") for _ in range(10)]
            await p.flush()
            metas = [await d for d in ds]
            assert p.epoch(topic) == 2
            assert p.stats["batches"] < len(ds) / 50  # batched, not one request per record
        for k, m in zip(keys * 20, metas):
            assert m.partition == lh_bucket(key_hash(k.encode()), 3, 5)
        by_part: dict[int, list[int]] = {}
        for m in metas:
            by_part.setdefault(m.partition, []).append(m.offset)
        for offs in by_part.values():
            assert offs == sorted(offs) and len(set(offs)) == len(offs)
        assert {(await d).partition for d in null} <= set(range(5))
        recs = await read(broker, topic, 8)
        assert sum(len(v) for v in recs.values()) == len(keys) * 20 + 10
        assert not recs[5] and not recs[6] and not recs[7]  # never a None partition
        for lst in recs.values():
            for r in lst:
                assert [k for k, _ in r.headers] == [STAMP_HEADER]  # one compact header
                assert record_epoch(r.headers) == 2 and p.producer_id.endswith("-" + record_producer(r.headers))

    asyncio.run(go())


def test_the_stamp_is_written_once_per_batch_and_every_record_is_read_stamped(broker: str) -> None:
    """The header goes on a batch's first record and on records with headers of their
    own; a reader sees every record stamped, also when it starts in mid-batch."""
    topic = name("prod-batchstamp")

    async def go() -> None:
        async with LayoutCoordinator(broker) as co:
            await co.create(topic, 1, capacity=1)
        async with Producer(broker, client_id="batched", config=ProducerConfig(batch_bytes=16 * 1024)) as p:
            for i in range(3000):
                await p.send(topic, f"k{i}", {"i": i}, headers=[("mine", b"%d" % i)] if i % 100 == 7 else None)
            await p.flush()
        async with KafkaIO(broker) as io:
            raw: list[list[list[str]]] = []  # per batch, per record: the header names written
            offset = 0
            while offset < 3000:
                _, _, data = await io._fetch_raw(topic, 0, offset, max_wait_ms=100, max_bytes=1 << 20)
                mr = MemoryRecords(data)
                while (batch := mr.next_batch()) is not None:
                    raw.append([[k for k, _ in r.headers] for r in batch])
                    offset = batch.next_offset
            records = (await io.read(topic, 0, 0))[0]
            middle = (await io.read(topic, 0, len(raw[0]) + 5))[0]
        assert len(raw) > 3 and sum(map(len, raw)) == 3000
        assert all(b[0][0] == STAMP_HEADER for b in raw)
        names = [h for b in raw for h in b[1:]]
        assert names.count([]) == len(names) - names.count([STAMP_HEADER, "mine"]) > 2000
        assert [record_epoch(r.headers) for r in records] == [1] * 3000
        assert all(record_producer(r.headers) == p.producer_id[-6:] for r in records)
        assert middle[0].offset == len(raw[0]) + 5 and record_epoch(middle[0].headers) == 1
        mine = [r for r in records if r.offset % 100 == 7]
        assert all([k for k, _ in r.headers] == [STAMP_HEADER, "mine"] for r in mine)

    asyncio.run(go())


def test_topic_without_layout_uses_kafkas_partitioner_then_follows_a_new_layout(broker: str, topic_factory) -> None:
    topic = topic_factory(4, prefix="prod-plain")

    async def go() -> None:
        async with Producer(broker, client_id="plain") as p:
            ms = [await (await p.send(topic, f"k{i}", i)) for i in range(50)]
            for i, m in enumerate(ms):
                assert m.partition == kafka_partition(f"k{i}".encode(), 4)
            assert p.epoch(topic) == 0
            async with LayoutCoordinator(broker) as co:
                await co.create(topic, 4)  # adopt: same placement, now with a layout
                deadline = time.monotonic() + 5
                while p.epoch(topic) != 1 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert p.epoch(topic) == 1
        recs = await read(broker, topic, 4)
        epochs = sorted({record_epoch(r.headers) for lst in recs.values() for r in lst})
        assert epochs == [0]

    asyncio.run(go())


def test_unsent_records_are_placed_again_after_a_change(broker: str) -> None:
    """Records still in an open batch when a change is announced go where the new
    layout puts them, stamped with the new epoch (they were not produced yet)."""
    topic = name("prod-replace")

    async def go() -> None:
        async with LayoutCoordinator(broker, ack_timeout=5) as co:
            await co.create(topic, 1, capacity=2)
            movers = [f"m{i}" for i in range(200) if lh_bucket(key_hash(f"m{i}".encode()), 1, 2) == 1][:20]
            async with Producer(broker, client_id="slow", config=ProducerConfig(linger_ms=60_000)) as p:
                ds = [await p.send(topic, k, 1) for k in movers]
                assert {d.partition for d in ds} == {0}
                res = await co.expand(topic, 2)  # the producer acks while its batch is still open
                assert p.producer_id in res.acked
                assert p.stats["replaced"] == len(movers)
                await p.flush()
                assert {(await d).partition for d in ds} == {1}
        recs = await read(broker, topic, 2)
        assert recs[0] == [] and [record_epoch(r.headers) for r in recs[1]] == [2] * len(movers)

    asyncio.run(go())


def test_records_waiting_in_an_open_batch_hold_little_more_than_their_bytes(broker: str) -> None:
    """A record waits in its open batch until it is sent (to be placed again after a
    layout change). orjson's output pins a buffer of 4 KiB however short it is: kept as
    it came, 20,000 records of 30 bytes held about 80 MB."""
    import tracemalloc

    topic = name("prod-held")

    async def go() -> float:
        async with Producer(broker, client_id="held", config=ProducerConfig(linger_ms=60_000)) as p:
            await p.send(topic, "k-0", {"n": 0})  # the topic's placement known, its batch open
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                for i in range(1, 20_001):
                    await p.send(topic, f"k-{i}", {"n": i, "pad": "x" * 8})
                held = tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
            assert p.stats["records"] == 20_001 and p._open, "the records wait in open batches"
            await p.flush()
        return held / 20_000

    per_record = asyncio.run(go())
    assert per_record < 1024, f"{per_record:.0f} bytes held per record waiting in an open batch"


def test_fence_raise_mode_and_clear(broker: str) -> None:
    topic = name("prod-fence")

    async def go() -> None:
        async with LayoutCoordinator(broker) as co:
            lay = await co.create(topic, 2, capacity=4)
        seen = []
        async with (
            Producer(broker, client_id="strict", config=ProducerConfig(on_fence="raise")) as p,
            Producer(broker, client_id="cb", config=ProducerConfig(on_fence=seen.append)) as q,
        ):
            await (await p.send(topic, "a", 1))
            async with LayoutRegistry(broker) as reg:
                await reg.load(topic)
                ann = await reg.publish(transitions.expand(lay, 3))
                # a coordinator sealed without their acks: both are named as fenced
                await reg.publish(transitions.seal(ann, {0: 1, 1: 1, 2: 0}, fenced=[p.producer_id, q.producer_id]))
            deadline = time.monotonic() + 5
            while not (p.fences and q.fences) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert [(f.topic, f.epoch) for f in p.fences] == [(topic, 2)]
            assert seen and seen[0].epoch == 2
            with pytest.raises(ProducerFencedError, match="fenced at epoch 2"):
                await p.send(topic, "a", 2)
            await (await q.send(topic, "a", 2))  # callback mode keeps going
            p.clear_fence()
            m = await (await p.send(topic, "a", 3))
            assert m.partition == lh_bucket(key_hash(b"a"), 2, 3)

    asyncio.run(go())


def test_lease_blocks_sends_until_layout_reread(broker: str) -> None:
    topic = name("prod-lease")

    async def go() -> None:
        async with LayoutCoordinator(broker) as co:
            await co.create(topic, 1, capacity=2)
        async with Producer(broker, client_id="lease", config=ProducerConfig(lease_ms=600, heartbeat_ms=200)) as p:
            await (await p.send(topic, "k", 1))
            for t in p._tasks:  # simulate a stalled lease keeper (as if paused)
                if t.get_name().endswith("-lease"):
                    t.cancel()
            await asyncio.sleep(0.7)
            before = p.stats["lease_renewals"]
            await (await p.send(topic, "k", 2))  # renews first: heartbeat + registry read
            assert p.stats["lease_renewals"] == before + 1

    asyncio.run(go())


def test_a_flush_right_after_the_linger_loop_sealed_a_batch_waits_for_it(broker: str) -> None:
    """The linger loop takes a batch out of the open ones and sends it from a task of its
    own. A flush that runs before that task's first step used to find the batch neither
    open nor in flight and return at once: the producer's last records could be counted as
    sent and never written (one record lost at the very end of a test run)."""
    topic = name("prod-linger")

    async def go() -> None:
        async with KafkaIO(broker) as io:
            await io.create_topic(topic, 1)
        async with Producer(broker, client_id="linger", config=ProducerConfig(linger_ms=1)) as p:
            for round_ in range(20):
                d = await p.send(topic, f"k{round_}", {"i": round_})
                while p._open:  # the linger loop seals the batch; its send task is only scheduled
                    await asyncio.sleep(0)
                await p.flush()
                assert d.done(), f"round {round_}: flush returned before the sealed batch was acknowledged"
        recs = await read(broker, topic, 1)
        assert [r.offset for r in recs[0]] == list(range(20))

    asyncio.run(go())


def test_a_cancelled_send_neither_drops_the_batch_it_filled_nor_lets_a_flush_pass_over_it() -> None:
    """A send that fills a batch hands it to the client itself, and may wait there (one
    batch per partition in flight). Cancelled meanwhile (a timer at a worker's stop), it
    dropped the whole batch, other senders' records included, and the next flush passed:
    a checkpoint would have committed input whose output was never written. (A fake
    client: what is tested is the producer's bookkeeping of its batches.)"""

    class Builder:
        def __init__(self) -> None:
            self.n = 0

        def append(self, timestamp: Any, key: Any, value: Any, headers: Any) -> Any:
            if self.n >= 2:  # a batch holds two records
                return None
            self.n += 1
            return types.SimpleNamespace(offset=self.n - 1)

    class Client:
        def __init__(self) -> None:
            self.sent: list[int] = []
            self.drained = asyncio.Event()

        async def start(self) -> None: ...
        async def stop(self) -> None: ...
        def create_batch(self) -> Builder:
            return Builder()

        async def partitions_for(self, topic: str) -> set[int]:
            return {0}

        async def send_batch(self, builder: Builder, topic: str, partition: int) -> asyncio.Future[Any]:
            await self.drained.wait()  # as aiokafka's wait_drain: another batch of the partition in flight
            self.sent.append(builder.n)
            done = asyncio.get_running_loop().create_future()
            done.set_result(types.SimpleNamespace(offset=0))
            return done

    async def scenario() -> list[int]:
        producer = Producer("127.0.0.1:1", config=ProducerConfig(follow_layouts=False, linger_ms=60_000))
        producer._kp = client = Client()  # type: ignore[assignment]
        await producer.start()
        await producer.send("out", b"k1", b"a member's")
        await producer.send("out", b"k2", b"two records")
        timer = asyncio.create_task(producer.send("out", b"k3", b"a timer's"))  # fills the batch: sends it
        await asyncio.sleep(0.01)
        timer.cancel()
        await asyncio.gather(timer, return_exceptions=True)
        client.drained.set()
        await producer.flush()
        await producer.stop()
        return client.sent

    assert asyncio.run(scenario()) == [2, 1]  # the full batch, then the timer's record
