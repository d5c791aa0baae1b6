"""Topic layouts: live partition expansion and reduction with in-order delivery.

- :mod:`streamkit.layout.model`: ``TopicLayout`` values and pure transitions.
- :mod:`streamkit.layout.placement`: key -> partition under a layout.
- :mod:`streamkit.layout.registry`: the layouts in the cluster (``__streamkit_layouts``).
- :mod:`streamkit.layout.protocol`: announce -> acknowledge -> seal; fencing; late records.
- :mod:`streamkit.layout.gating`: what a processor may deliver (pure).
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
