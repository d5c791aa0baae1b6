"""The Spark bridge: backfill an app's stores from history, and read stores back.

Needs the ``spark`` extra (``pip install 'streamkit[spark]'``); importing this package
does not import pyspark, each entry point checks for it and names the extra if missing.

- :class:`BackfillOptions`: the options both modes share (columns, positions, processor
  counts, cluster, state directory, how the job runs).
- :func:`backfill_state` / :func:`backfill_table` (mode 1): a DataFrame of final state
  per table -> the stores each processor opens, with checkpoint positions stamped.
- :func:`backfill_replay` (mode 2): a DataFrame of historical input records -> the
  app's own handlers replayed per key inside Spark -> the stores.
- :func:`read_stores`: the stores as a DataFrame ``(processor, key, value)`` (the
  ``streamkit`` Python data source, one Spark partition per store).
- :func:`local_session`: a local SparkSession configured for the bridge.
- :func:`recover`: roll back a publish a killed backfill left half done.

See ``docs`` in each module: :mod:`.backfill` (the job), :mod:`.staging` (staging and
atomic publication), :mod:`.placement`, :mod:`.encoding`, :mod:`.tasks`, :mod:`.source`.
"""

from __future__ import annotations

import importlib
from typing import Any

from streamkit.spark._deps import SparkExtraMissing

__all__ = [
    "BackfillBusy",
    "BackfillError",
    "BackfillOptions",
    "BackfillRefused",
    "BackfillResult",
    "InjectedFailure",
    "Reporter",
    "SparkExtraMissing",
    "backfill_replay",
    "backfill_state",
    "backfill_table",
    "local_session",
    "read_stores",
    "recover",
]

_LAZY = {
    "BackfillOptions": "streamkit.spark.options",
    "BackfillResult": "streamkit.spark.backfill",
    "Reporter": "streamkit.spark.backfill",
    "backfill_replay": "streamkit.spark.backfill",
    "backfill_state": "streamkit.spark.backfill",
    "backfill_table": "streamkit.spark.backfill",
    "local_session": "streamkit.spark.session",
    "read_stores": "streamkit.spark.source",
    "recover": "streamkit.spark.staging",
    "BackfillBusy": "streamkit.spark.staging",
    "BackfillError": "streamkit.spark.staging",
    "BackfillRefused": "streamkit.spark.staging",
    "InjectedFailure": "streamkit.spark.staging",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'streamkit.spark' has no attribute {name!r}")
    if module in ("streamkit.spark.backfill", "streamkit.spark.source"):
        from streamkit.spark._deps import require

        require("pyarrow")
    return getattr(importlib.import_module(module), name)
