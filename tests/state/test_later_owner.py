"""Whether a store on a disk is behind a later owner of its processor, read from the
changelog beyond the store's position (``ChangelogWriter.later_owner``), against a real
broker: a later owner's checkpoint that moved in the input, or that changed keys at the
same positions (a timer's writes, a wall-clock close), is; its takeover of this very state
(an empty batch at the same positions) is not, nor a zombie's batch (an older generation)."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer

from stores.base import Checkpoint
from streamkit.checkpoint_keys import CHANGELOG_POSITION
from streamkit.kafkaio import KafkaIO
from streamkit.state.changelog import ChangelogWriter
from streamkit.testing import unique_topic_name

SOURCE = ("orders", 0)


def test_a_store_is_behind_a_later_owners_checkpoint_not_its_takeover_nor_a_zombies(broker: str) -> None:
    async def run() -> list[bool]:
        async with KafkaIO(broker) as io:
            producer = AIOKafkaProducer(bootstrap_servers=broker, enable_idempotence=False)
            await producer.start()
            try:
                changelog = ChangelogWriter(producer, io, unique_topic_name("later-changelog"))
                await changelog.ensure(1)
                ours = Checkpoint(positions={SOURCE: 10}, generation=1)
                at = await changelog.write(0, [(b"counts\x00k", b"1")], ours, base=None)
                store = ours.replace(extra={CHANGELOG_POSITION: at})
                found = []

                async def behind() -> bool:
                    return await changelog.later_owner(0, store) is not None

                took = await changelog.write(0, (), ours.replace(generation=2), base=at)  # a takeover
                found.append(await behind())
                zombie = await changelog.write(
                    0, [(b"counts\x00k", b"2")], ours.replace(positions={SOURCE: 12}), base=at
                )
                found.append(await behind())
                timer = await changelog.write(0, [(b"counts\x00t", b"1")], ours.replace(generation=2), base=took)
                found.append(await behind())
                assert zombie < timer
                store2 = store.replace(extra={CHANGELOG_POSITION: timer}, generation=2)  # read on: its own
                found.append(await changelog.later_owner(0, store2) is not None)
                await changelog.write(0, (), ours.replace(positions={SOURCE: 20}, generation=3), base=timer)
                found.append(await changelog.later_owner(0, store2) is not None)
                return found
            finally:
                await producer.stop()

    assert asyncio.run(run()) == [False, False, True, False, True]
