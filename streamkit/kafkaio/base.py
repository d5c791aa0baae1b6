"""The connection of :class:`streamkit.kafkaio.KafkaIO`: its clients, the metadata it
asks for (partition counts, leaders, API versions) and its one raw fetch request.

The reads (``reads``), the offsets (``offsets``) and the topic admin (``admin``) are
written on top of this (``client``: :class:`KafkaIO` is all of them).
"""

from __future__ import annotations

import asyncio
import time
from typing import Self

from aiokafka import AIOKafkaClient
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError, NodeNotReadyError, RequestTimedOutError, for_code
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.structs import TopicPartition

from streamkit.connection import Connection, as_connection, connect_failure, quiet_bootstrap
from streamkit.errors import StreamkitError

__all__ = ["KafkaIOBase", "KafkaIOError"]


class KafkaIOError(StreamkitError):
    """The broker could not be reached or refused a request; the message says which."""


class KafkaIOBase:
    """One low-level client for raw fetches, plus an admin client made on demand."""

    def __init__(self, broker: str | Connection, *, client_id: str = "streamkit", request_timeout_ms: int = 10_000):
        self.connection = as_connection(broker)
        self.bootstrap = self.connection.bootstrap
        self._client_id = client_id
        self._timeout_ms = request_timeout_ms
        self._client: AIOKafkaClient | None = None
        self._admin: AIOKafkaAdminClient | None = None

    async def start(self) -> Self:
        if self._client is None:
            client = AIOKafkaClient(
                **self.connection.client_kwargs(), client_id=self._client_id, request_timeout_ms=self._timeout_ms
            )
            try:
                with quiet_bootstrap():  # its cause is reported once, by connect_failure
                    await client.bootstrap()
            except Exception:  # noqa: BLE001 - a rejected SCRAM login is a KeyError in aiokafka
                await client.close()
                raise await connect_failure(self.connection) from None
            self._client = client
        return self

    async def close(self) -> None:
        if self._admin is not None:
            await self._admin.close()
            self._admin = None
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def client(self) -> AIOKafkaClient:
        if self._client is None:
            raise KafkaIOError("KafkaIO not started")
        return self._client

    async def admin(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            admin = AIOKafkaAdminClient(
                **self.connection.client_kwargs(), request_timeout_ms=self._timeout_ms, client_id=self._client_id
            )
            try:
                with quiet_bootstrap():
                    await admin.start()
            except Exception:  # noqa: BLE001 - as in start()
                await admin.close()
                raise await connect_failure(self.connection) from None
            self._admin = admin
        return self._admin

    # ------------------------------------------------------------------ metadata

    async def partition_count(self, topic: str, *, refresh: bool = True) -> int | None:
        """Physical partitions of ``topic`` (None if it does not exist).

        Asks with ``allow_auto_topic_creation=False``: brokers that auto-create topics
        on metadata requests (Tansu does) must not create it by being asked.
        """
        c = self.client
        for attempt in range(3):
            node = c.get_random_node()
            if node is None:
                await c.force_metadata_update()
                node = c.get_random_node()
            try:
                resp = await c.send(node, MetadataRequest([topic], False))
            except (NodeNotReadyError, RequestTimedOutError, KafkaConnectionError) as exc:
                if attempt == 2:
                    raise KafkaIOError(f"metadata request failed: {exc}") from None
                await asyncio.sleep(0.05)
                continue
            for t in resp.topics:
                err, name = t[0], t[1]
                parts = next((x for x in t[2:] if isinstance(x, list)), [])
                if name == topic:
                    if err == 0 and parts:
                        return len(parts)
                    if err in (0, 3):  # 3: UNKNOWN_TOPIC_OR_PARTITION
                        return None
                    if attempt == 2:
                        raise KafkaIOError(f"metadata of {topic}: {for_code(err).__name__}")
            await asyncio.sleep(0.05)
        return None

    async def _leader(self, tp: TopicPartition, timeout: float = 10.0) -> int:
        c = self.client
        deadline = time.monotonic() + timeout
        c.add_topic(tp.topic)
        while True:
            leader = c.cluster.leader_for_partition(tp)
            if leader is not None and leader >= 0:
                return leader
            if time.monotonic() > deadline:
                raise KafkaIOError(f"no leader for {tp.topic}[{tp.partition}] (does the topic exist?)")
            await c.force_metadata_update()
            if c.cluster.leader_for_partition(tp) is None:
                await asyncio.sleep(0.05)

    async def supports_api(self, api_key: int) -> bool:
        c = self.client
        node = next(iter(b.nodeId for b in c.cluster.brokers()), None)
        if node is None:
            await c.force_metadata_update()
            node = next(iter(b.nodeId for b in c.cluster.brokers()), None)
        if node is None:
            return False
        conn = await c._get_conn(node)  # noqa: SLF001 - aiokafka keeps ApiVersions on the connection
        versions = getattr(conn, "_versions", None) or {}
        return api_key in versions

    async def _fetch_raw(
        self, topic: str, partition: int, offset: int, *, max_wait_ms: int, max_bytes: int
    ) -> tuple[int, int, bytes | None]:
        tp = TopicPartition(topic, partition)
        for attempt in range(4):
            node = await self._leader(tp)
            req = FetchRequest(max(1, max_wait_ms), 1, max_bytes, 0, [(topic, [(partition, offset, max_bytes)])])
            try:
                resp = await self.client.send(node, req)
            except (NodeNotReadyError, RequestTimedOutError, KafkaConnectionError) as exc:
                if attempt == 3:
                    raise KafkaIOError(f"fetch {topic}[{partition}] failed: {exc}") from None
                self.client.force_metadata_update()
                await asyncio.sleep(0.05 * (attempt + 1))
                continue
            for _t, parts in resp.topics:
                for p, err, hw, *data in parts:
                    if p == partition:
                        return err, hw, data[-1]
            # Tansu answers an immediate empty response when nothing is there yet.
            return 0, -1, None
        raise AssertionError("unreachable")
