"""Exceptions a user of streamkit may see, each naming what was wrong and where."""

from __future__ import annotations


class StreamkitError(Exception):
    """Base class of every streamkit error."""


class ConfigError(StreamkitError):
    """The app or the command line asks for something inconsistent."""


class AppLoadError(StreamkitError):
    """`MODULE:APP` could not be imported or does not name an App."""


class TopicNotFoundError(StreamkitError):
    """An input topic does not exist on the broker."""


class BrokerUnreachableError(StreamkitError):
    """No Kafka-protocol broker answered at the given address."""


class JobMismatchError(StreamkitError):
    """A worker's configuration disagrees with what the job recorded in the cluster."""


class ReplayError(StreamkitError):
    """A handler did something the offline replay (Spark backfill) cannot reproduce."""


class HistoryTruncatedError(StreamkitError):
    """The input history a rebuild needs is no longer in the topic (retention, deleted
    records): rebuilding from what is left would build incomplete state."""


class AssignmentError(StreamkitError):
    """A worker could not take (or give up) the partitions the group assigned it: its
    state directory, a store or a restore failed. It stops rather than stay alive and idle."""
