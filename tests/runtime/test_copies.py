"""Looking for the copies a dead sweep left (``copies.find_copies``) reads a topic's whole
history at most twice per process: a later look, at a later rebalance, reads only what the
topic gained since the look before the last one (a batch in flight at a look has landed
by the next), and still finds every copy (real broker)."""

from __future__ import annotations

import asyncio
import uuid

from aiokafka import AIOKafkaProducer

from streamkit.kafkaio import KafkaIO
from streamkit.layout.seal import OriginSeal
from streamkit.layout.strays import STRAY_HEADER
from streamkit.runtime.copies import ScannedCopies, find_copies

SEAL = OriginSeal(b"s" * 32)


async def _write(bootstrap: str, topic: str, partition: int, n: int, copies: list[tuple[int, int]]) -> None:
    """``n`` plain records, then one forwarded copy per (origin partition, offset), then a
    record that only claims to be one (no seal): it must not count as a copy."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        sent = [await producer.send(topic, b"v", key=b"k%d" % i, partition=partition) for i in range(n)]
        sent += [
            await producer.send(
                topic, b"c", key=b"c", partition=partition, headers=[(STRAY_HEADER, SEAL.seal(topic, q, o, b"c", b"c"))]
            )
            for q, o in copies
        ]
        sent.append(await producer.send(topic, b"c", key=b"c", partition=partition, headers=[(STRAY_HEADER, b"0:99")]))
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


def test_a_second_look_reads_only_what_the_topic_gained_and_finds_every_copy(broker: str) -> None:
    async def go() -> None:
        topic = f"copies-{uuid.uuid4().hex[:8]}"
        async with KafkaIO(broker) as io:
            await io.create_topic(topic, 2)
            await _write(broker, topic, 1, 300, [(0, 5), (0, 40), (1, 7)])
            scanned = ScannedCopies()
            first = await find_copies(io, topic, {0: 10}, {0: None}, SEAL, scanned)
            assert first == {0: {40}}  # (the copy of offset 5 is below the start)
            assert scanned.read_to[0] == {0: 0, 1: 304}

            await _write(broker, topic, 0, 20, [(0, 60)])
            second = await find_copies(io, topic, {0: 0}, {0: None}, SEAL, scanned)
            assert second == {0: {5, 40, 60}}  # the old copies kept, the new one read (a claim is no copy)
            assert scanned.read_to[0] == {0: 22, 1: 304} and scanned.settled[0] == {0: 0, 1: 304}

            await _write(broker, topic, 1, 10, [(0, 70)])
            third = await find_copies(io, topic, {0: 50}, {0: None}, SEAL, scanned)
            assert third == {0: {60, 70}}
            assert scanned.read_to[0] == {0: 22, 1: 316} and scanned.settled[0] == {0: 22, 1: 304}

            # a fresh process reads the whole topic again, and finds the same
            assert await find_copies(io, topic, {0: 0}, {0: None}, SEAL) == {0: second[0] | third[0]}
            # an origin never looked for: its copies are in the whole history
            assert await find_copies(io, topic, {1: 0}, {1: None}, SEAL, scanned) == {1: {7}}

    asyncio.run(go())


def test_a_partition_shorter_than_where_it_was_read_forgets_what_was_read() -> None:
    scanned = ScannedCopies(copies={0: {3}}, read_to={0: {0: 50, 1: 10}})
    scanned.forget_if_shorter({0: 50, 1: 10})
    assert scanned.copies == {0: {3}}
    scanned.forget_if_shorter({0: 20, 1: 10})  # the topic was deleted and created again
    assert scanned.copies == {} and scanned.read_to == {}
