"""Joins: global tables (a whole topic on every worker, for lookups by any key)."""

from streamkit.joins.global_table import GlobalTable

__all__ = ["GlobalTable"]
