"""How a :class:`streamkit.producer.Producer` is tuned: :class:`ProducerConfig`.

Every field has the default the producer had before it took a configuration object, so
``Producer(bootstrap, client_id=...)`` is the common call and a config names only what
it changes::

    Producer(bootstrap, client_id="orders-api", config=ProducerConfig(linger_ms=2))

``dataclasses.replace(config, linger_ms=0)`` derives one from another.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from streamkit.fencing import FenceEvent
from streamkit.layout.control import DEFAULT_HEARTBEAT_MS, DEFAULT_LEASE_MS
from streamkit.layout.registry import ACKS_TOPIC, LAYOUTS_TOPIC

__all__ = ["ProducerConfig"]


@dataclass(frozen=True)
class ProducerConfig:
    """The tuning, protocol and callback options of a :class:`streamkit.producer.Producer`."""

    # -- batching and the broker
    linger_ms: float = 5.0
    """How long an open batch waits to fill before it is handed to the broker."""
    batch_bytes: int = 512 * 1024
    """A batch is handed to the broker when it holds this many bytes."""
    acks: int | str = "all"
    """The broker acknowledgements a batch waits for (aiokafka's ``acks``)."""
    compression_type: str | None = None
    """aiokafka's ``compression_type`` (None: uncompressed)."""
    request_timeout_ms: int = 30_000
    """aiokafka's ``request_timeout_ms``."""

    # -- the layout change protocol (``streamkit.layout.protocol``)
    lease_ms: int = DEFAULT_LEASE_MS
    """How long a heartbeat or registry read lets the producer place records (``streamkit.lease``)."""
    heartbeat_ms: int = DEFAULT_HEARTBEAT_MS
    """How often the producer heartbeats (at most half of ``lease_ms``)."""
    refresh_ms: int = 100
    """How often the producer polls the layout registry."""
    follow_layouts: bool = True
    """False: no registry, lease or acknowledgements; every topic is placed by Kafka's partitioner."""
    layouts_topic: str = LAYOUTS_TOPIC
    """The layout registry's topic."""
    acks_topic: str = ACKS_TOPIC
    """The topic of heartbeats, acknowledgements and the other control records."""

    # -- callbacks
    on_fence: str | Callable[[FenceEvent], Any] = "warn"
    """``"warn"``, ``"raise"`` (later sends raise until ``clear_fence``) or a callable
    given each :class:`streamkit.fencing.FenceEvent` (``streamkit.fencing``)."""
    before_ack: Callable[[str, int], Awaitable[Any]] | None = None
    """Awaited with (topic, epoch) before an announced change is acknowledged: a worker's
    consumers first take the announced layout (``streamkit.runtime.adoption``)."""
    key_serializer: Callable[[Any], bytes | None] | None = None
    """A record key to bytes (None: ``streamkit.delivery.encode_key``); a bytes key is sent as it is."""
    value_serializer: Callable[[Any], bytes | None] | None = None
    """A record value to bytes (None: ``streamkit.delivery.encode_value``); a bytes value is sent as it is."""
