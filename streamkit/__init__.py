"""streamkit: stateful stream processing on Kafka that scales live.

Public API: `App`, `Context`, `load_app`, and the windows `Tumbling`, `Hopping`, `Session`, `Count`.
"""

from streamkit.app import App
from streamkit.context import Context
from streamkit.loader import load_app
from streamkit.windows import Count, Hopping, Session, Tumbling, Window

__all__ = ["App", "Context", "Count", "Hopping", "Session", "Tumbling", "Window", "load_app"]
__version__ = "0.1.0"
