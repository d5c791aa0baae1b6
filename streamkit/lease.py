"""A producer's lease: the right to place records with the layouts it has read.

A streamkit producer may place a record only while
``now < min(start of its last heartbeat write, start of its last registry read) + lease``;
otherwise it first heartbeats and re-reads the registry (`Lease.renew`). A layout
coordinator waits for every producer that may hold a lease, and no longer than a lease:
so no producer places a record with an old layout after a change is sealed without
having read it (see ``streamkit.layout.protocol``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from streamkit.layout.control import control_record, heartbeat_fields
from streamkit.layout.registry import LayoutRegistry

log = logging.getLogger("streamkit.producer")

SendControl = Callable[[bytes, bytes], Awaitable[Any]]
"""Write a control record (key, value) to the acks log and wait until it is stored."""


class Lease:
    def __init__(
        self,
        producer_id: str,
        client_id: str,
        registry: LayoutRegistry,
        send_control: SendControl,
        *,
        lease_ms: int,
        heartbeat_ms: int,
        refresh_ms: int,
    ) -> None:
        if heartbeat_ms * 2 > lease_ms:
            raise ValueError(f"heartbeat_ms ({heartbeat_ms}) must be at most half of lease_ms ({lease_ms})")
        self.producer_id = producer_id
        self.client_id = client_id
        self.registry = registry
        self._send = send_control
        self.lease_ms = lease_ms
        self.seconds = lease_ms / 1000
        self.heartbeat_interval = heartbeat_ms / 1000
        self.refresh_interval = refresh_ms / 1000
        self.until = float("-inf")
        """``time.monotonic()`` at which the lease runs out."""
        self.renewals = 0
        self._last_hb_start = float("-inf")
        self._lock = asyncio.Lock()

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.until

    async def heartbeat(self) -> None:
        started = time.monotonic()
        key, value = control_record("hb", self.producer_id, **heartbeat_fields(self.client_id, self.lease_ms))
        await self._send(key, value)
        self._last_hb_start = started

    async def renew(self) -> None:
        """Heartbeat and re-read the registry; extend the lease from the older start."""
        async with self._lock:
            if time.monotonic() < self.until - self.seconds / 2:
                return  # renewed by another task meanwhile
            await self.heartbeat()
            await self.registry.refresh()
            self._extend()
            self.renewals += 1

    async def keep(self) -> None:
        """Heartbeat every heartbeat interval and re-read the registry every refresh
        interval, extending the lease, until cancelled."""
        while True:
            try:
                await asyncio.sleep(self.refresh_interval)
                if time.monotonic() - self._last_hb_start >= self.heartbeat_interval:
                    await self.heartbeat()
                await self.registry.refresh()
                self._extend()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the lease runs out; sends wait for renewal
                log.warning("%s: layout refresh failed: %s", self.producer_id, exc)

    def _extend(self) -> None:
        self.until = min(self._last_hb_start, self.registry.last_refresh_start) + self.seconds
