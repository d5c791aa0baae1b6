"""Joins: global tables (a whole topic on every worker, for lookups by any key), tables
fed by a topic (versioned, read as of a record's time), windowed stream-stream joins,
and the time-ordered merge of a processor's inputs that makes them the same in every run."""

from streamkit.joins.fed_table import FedTable
from streamkit.joins.global_table import GlobalTable
from streamkit.joins.merge import TimeMerge
from streamkit.joins.stream_join import StreamJoin

__all__ = ["FedTable", "GlobalTable", "StreamJoin", "TimeMerge"]
