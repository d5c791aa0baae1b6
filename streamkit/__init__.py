"""streamkit: stateful stream processing on Kafka that scales live.

Public API: `App`, `Tumbling`, `Context`, `load_app`.
"""

from streamkit.app import App
from streamkit.context import Context
from streamkit.loader import load_app
from streamkit.windows import Tumbling

__all__ = ["App", "Context", "Tumbling", "load_app"]
__version__ = "0.1.0"
