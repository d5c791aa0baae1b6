"""The broker streamkit runs on when none is given: Tansu, embedded (see `embedded`)."""

from streamkit.broker.embedded import EmbeddedBroker, ExternalBroker, resolve_broker, tansu_binary
from streamkit.broker.probe import BrokerError, api_versions, parse_address, wait_for_broker

__all__ = [
    "BrokerError",
    "EmbeddedBroker",
    "ExternalBroker",
    "api_versions",
    "parse_address",
    "resolve_broker",
    "tansu_binary",
    "wait_for_broker",
]
