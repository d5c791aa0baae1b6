"""streamkit: stateful stream processing on Kafka that scales live.

Public API: `App`, `Context`, `load_app`, and the windows `Tumbling`, `Hopping`, `Sliding`, `Session`, `Count`.
"""

from streamkit.app import App
from streamkit.context import Context
from streamkit.loader import load_app
from streamkit.windows import Count, Hopping, Session, Sliding, Tumbling, Window

__all__ = ["App", "Context", "Count", "Hopping", "Session", "Sliding", "Tumbling", "Window", "load_app"]
__version__ = "0.1.0"
