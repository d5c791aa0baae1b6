"""The seal on forwarded strays' origins (``streamkit.layout.seal``): only a copy streamkit
forwarded, under the cluster's key, names an origin; the key is the first one written."""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

from aiokafka import AIOKafkaProducer

from streamkit.kafkaio import KafkaIO
from streamkit.layout.seal import SEAL_RECORD_KEY, SEAL_TOPIC, OriginSeal, load_seal
from streamkit.layout.strays import STRAY_HEADER


class Rec(NamedTuple):
    key: bytes | None
    value: bytes | None
    headers: Any


def test_a_sealed_origin_opens_only_on_the_record_it_was_sealed_for() -> None:
    seal = OriginSeal(b"a" * 32)
    header = seal.seal("orders", 3, 17, b"k", b"v")
    assert seal.origin("orders", Rec(b"k", b"v", [("sk", b"x"), (STRAY_HEADER, header)])) == (3, 17)
    assert seal.origin("orders", Rec(b"k", b"v", [(STRAY_HEADER, header), ("other", b"")])) is None  # not last
    assert seal.origin("payments", Rec(b"k", b"v", [(STRAY_HEADER, header)])) is None
    assert seal.origin("orders", Rec(b"k", b"w", [(STRAY_HEADER, header)])) is None
    assert seal.origin("orders", Rec(b"j", b"v", [(STRAY_HEADER, header)])) is None
    assert seal.origin("orders", Rec(b"k", b"v", [(STRAY_HEADER, header.replace(b"3:17", b"3:18"))])) is None
    assert OriginSeal(b"b" * 32).origin("orders", Rec(b"k", b"v", [(STRAY_HEADER, header)])) is None
    for junk in (b"3:17", b"3:17:", b"", b"::", b"a:b:c", b"\xff" * 40, b"1:2:3:4"):
        assert seal.origin("orders", Rec(b"k", b"v", [(STRAY_HEADER, junk)])) is None
    keyless = seal.seal("orders", 0, 1, None, b"")
    assert seal.origin("orders", Rec(None, b"", [(STRAY_HEADER, keyless)])) == (0, 1)
    assert seal.origin("orders", Rec(b"", b"", [(STRAY_HEADER, keyless)])) is None  # no key is not an empty one


def test_workers_starting_together_agree_on_the_first_key_and_skip_garbage(broker: str) -> None:
    """A fresh broker: garbage first in the seal topic, then two loaders at once: both take
    the first well-formed key, and a later loader reads the same one."""
    from streamkit.broker import EmbeddedBroker

    async def go(bootstrap: str) -> None:
        async with KafkaIO(bootstrap) as io:
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
            await producer.start()
            try:
                await io.create_topic(SEAL_TOPIC, 1)
                await producer.send_and_wait(SEAL_TOPIC, b"short", key=SEAL_RECORD_KEY)
                await producer.send_and_wait(SEAL_TOPIC, b"x" * 32, key=b"another key")

                async def make() -> AIOKafkaProducer:
                    return producer

                a, b = await asyncio.gather(load_seal(io, make), load_seal(io, make))
                assert a == b and a.key not in (b"x" * 32,)
                assert await load_seal(io, make, create=False) == a
            finally:
                await producer.stop()

    with EmbeddedBroker() as own:  # garbage in an internal topic stays out of the other tests' broker
        asyncio.run(go(own.bootstrap))


def test_a_copy_header_never_opens_as_an_origin_and_the_other_way_round() -> None:
    from streamkit.layout.stamps import COPY_HEADER

    seal = OriginSeal(b"a" * 32)
    copy = seal.seal_copy("orders", 3, b"k", b"v")
    assert seal.copy_of("orders", Rec(b"k", b"v", [(COPY_HEADER, copy), ("sk", b"x")])) == 3
    placed, mac = copy.split(b":")
    as_origin = b"%s:-1:%s" % (placed, mac)  # the same MAC, offered as a stray's origin
    assert seal.origin("orders", Rec(b"k", b"v", [(STRAY_HEADER, as_origin)])) is None
    origin = seal.seal("orders", 3, -1, b"k", b"v")
    p, _, origin_mac = origin.split(b":")
    assert seal.copy_of("orders", Rec(b"k", b"v", [(COPY_HEADER, p + b":" + origin_mac)])) is None
    assert seal.copy_of("orders", Rec(b"k", b"v", [(COPY_HEADER, b"3")])) is None  # a plain producer's header


def test_only_a_first_header_naming_an_epoch_stamps_a_record() -> None:
    from streamkit.layout.stamps import EPOCH_HEADER, stamp, stamp_epoch

    assert stamp_epoch([stamp(b"a1b2c3", 7)]) == 7
    assert stamp_epoch([(EPOCH_HEADER, b"4"), ("x", b"")]) == 4
    for headers in ([stamp(b"a1b2c3", 0)], [("sk", b"junk")], [("sk", b"")], [("x", b""), stamp(b"a1b2c3", 7)], []):
        assert stamp_epoch(headers) is None, headers
