"""Joins: global tables (a whole topic on every worker, for lookups by any key), tables
fed by a topic (versioned, read as of a record's time) and the time-ordered merge of a
processor's inputs that makes those reads the same in every run."""

from streamkit.joins.fed_table import FedTable
from streamkit.joins.global_table import GlobalTable
from streamkit.joins.merge import TimeMerge

__all__ = ["FedTable", "GlobalTable", "TimeMerge"]
