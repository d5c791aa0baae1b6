"""Topic layouts: live partition expansion and reduction with in-order delivery.

- :mod:`streamkit.layout.model`: ``TopicLayout`` values; :mod:`streamkit.layout.transitions`:
  the pure transitions between them (and the checks that refuse a change up front).
- :mod:`streamkit.layout.placement`: key -> partition under a layout.
- :mod:`streamkit.layout.registry`: the layouts in the cluster (``__streamkit_layouts``).
- :mod:`streamkit.layout.protocol`: announce -> acknowledge -> seal (``LayoutCoordinator``);
  :mod:`streamkit.layout.control`: the control records producers write (heartbeats, acks).
- :mod:`streamkit.layout.gating`: what a processor may deliver (pure).
- :mod:`streamkit.layout.stamps`: epoch stamps on records and what a consumer makes of them;
  :mod:`streamkit.layout.check`: a scan of a topic for late and misplaced records.
- :mod:`streamkit.layout.epochs`: epoch stamps of checkpoints and commits (zombie fencing).
"""

from streamkit.layout.model import (
    ChangeKind,
    LayoutError,
    PartitionMode,
    PendingChangeError,
    Seal,
    TopicLayout,
)

__all__ = ["ChangeKind", "LayoutError", "PartitionMode", "PendingChangeError", "Seal", "TopicLayout"]
