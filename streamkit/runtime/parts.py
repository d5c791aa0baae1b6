"""What one group member is made of, made once by the member and handed to those that
work for it: its task manager (``tasks``) and its scaling (``scale.joining``)."""

from __future__ import annotations

from dataclasses import dataclass

from assignors.group import StreamkitAssignor
from streamkit.joins.merge import Lagging
from streamkit.runtime.admission import Admission
from streamkit.runtime.catchup import CatchUp
from streamkit.runtime.dispatch import Dispatcher
from streamkit.runtime.group_consumer import GroupConsumer
from streamkit.runtime.merging import HeldBack
from streamkit.runtime.routing import Router

__all__ = ["MemberParts"]


@dataclass(frozen=True)
class MemberParts:
    name: str
    """The member, in log lines (its consumer's client id)."""
    consumer: GroupConsumer
    assignor: StreamkitAssignor
    admission: Admission
    """What of a fetch answer each hosted processor may apply (its routes)."""
    router: Router
    """Turns an assignment's slots into routes."""
    dispatcher: Dispatcher
    """Applies admitted records to the processors' state (handlers, output)."""
    held_back: HeldBack
    """The consumer's pauses for the tasks' back-pressure (``Task.back_pressure``)."""
    lagging: Lagging
    """Whether a topic has records for a task that no fetch brought yet (its merge's wait)."""
    catchup: CatchUp
    """Reads history into a processor (rebuilds, left history)."""
