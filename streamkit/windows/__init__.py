"""Windows: the kinds (``kinds``), one processor's windows, book and closes (``state``),
and windowed tables as handlers use them (``table``).

This package holds what windows mean; the runtime hands it a processor's tables and its
stream time, and fires the close callbacks it reports due (``streamkit.runtime.closes``).
"""

from streamkit.windows.kinds import (
    DEFAULT_RETENTION,
    STREAM_TIME_KEY,
    Count,
    Hopping,
    LateRecordError,
    Session,
    Sliding,
    Tumbling,
    Window,
    WindowKind,
)
from streamkit.windows.state import WindowState
from streamkit.windows.table import BookTable, WindowedTable, WindowKeySerde

__all__ = [
    "DEFAULT_RETENTION",
    "STREAM_TIME_KEY",
    "BookTable",
    "Count",
    "Hopping",
    "LateRecordError",
    "Session",
    "Sliding",
    "Tumbling",
    "Window",
    "WindowKeySerde",
    "WindowKind",
    "WindowState",
    "WindowedTable",
]
