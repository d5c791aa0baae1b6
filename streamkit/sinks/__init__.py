"""Sinks: rows a handler writes to a database (``ctx.write(sink, row)``), committed with
its processor's checkpoint, exactly once.

``base`` is the interface (``Sink``, ``SinkBatch``) and ``outbox`` the rows of one
processor between checkpoints; ``postgres`` and ``delta`` are the sinks streamkit ships.
"""

from streamkit.sinks.base import Sink, SinkBatch

__all__ = ["Sink", "SinkBatch"]
