"""A test driver: run an app's handlers, tables, windows and timers without a broker
(``TestDriver``; also importable from ``streamkit.testing``)."""

from streamkit.testdriver.capture import DeadLetter, OutputRecord
from streamkit.testdriver.driver import TestDriver

__all__ = ["DeadLetter", "OutputRecord", "TestDriver"]
