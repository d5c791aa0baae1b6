"""Epoch stamps of checkpoints and commits (KIP-232): refuse what a zombie writes.

Every checkpoint and every progress/commit record streamkit writes carries the
layout epoch of each topic it covers and the consumer-group generation it was made
in (``stores.base.Checkpoint.layout_epochs`` / ``.generation``; the test broker drops
commit metadata, so the stamp travels in streamkit's own records, never only in the
commit's metadata string).

Rule (KIP-232's, made strict): a stamp is *older* than another when any of its
components is smaller: its generation, or the layout epoch of any topic both name.
A write whose stamp is older than the newest stamp already stored is rejected with
:class:`ZombieError` -- it comes from a processor that missed a rebalance or a layout
change (a zombie).  KIP-232 compares lexicographically (topic epoch, then leader
epoch); streamkit's two counters are independent (a zombie of generation 5 may well
have read layout epoch 7), so each must be at least the stored one.

On restore (as in KIP-232): a checkpoint naming a layout epoch newer than the cached
layout means the cache is stale: re-read the registry until it has caught up
(``LayoutRegistry.ensure_at_least``) before using the checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from streamkit.layout.model import LayoutError

__all__ = ["EpochStamp", "ZombieError", "check_stamp", "newer_epochs_needed", "stamp_of"]


class ZombieError(LayoutError):
    """A checkpoint or commit stamped older than one already stored (KIP-232)."""


class _Stamped(Protocol):
    layout_epochs: Mapping[str, int]
    generation: int


@dataclass(frozen=True)
class EpochStamp:
    layout_epochs: Mapping[str, int] = field(default_factory=dict)
    generation: int = -1

    def older_than(self, other: EpochStamp) -> list[str]:
        """Why this stamp is older than ``other`` (empty: it is not)."""
        why = []
        if 0 <= self.generation < other.generation:
            why.append(f"generation {self.generation} < {other.generation}")
        for t, e in self.layout_epochs.items():
            o = other.layout_epochs.get(t)
            if o is not None and e < o:
                why.append(f"{t} layout epoch {e} < {o}")
        return why

    def merge(self, other: EpochStamp) -> EpochStamp:
        """The component-wise maximum (the newest stamp seen)."""
        epochs = dict(self.layout_epochs)
        for t, e in other.layout_epochs.items():
            epochs[t] = max(e, epochs.get(t, e))
        return EpochStamp(epochs, max(self.generation, other.generation))

    def to_dict(self) -> dict[str, Any]:
        return {"layout_epochs": dict(self.layout_epochs), "generation": self.generation}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EpochStamp:
        return cls({str(k): int(v) for k, v in d.get("layout_epochs", {}).items()}, int(d.get("generation", -1)))


def stamp_of(obj: _Stamped | EpochStamp | Mapping[str, Any]) -> EpochStamp:
    """The stamp of a ``stores.base.Checkpoint`` (or anything with the two fields)."""
    if isinstance(obj, EpochStamp):
        return obj
    if isinstance(obj, Mapping):
        return EpochStamp.from_dict(obj)
    return EpochStamp(dict(obj.layout_epochs), int(obj.generation))


def check_stamp(stored: Any, incoming: Any, *, what: str = "commit") -> None:
    """Raise :class:`ZombieError` if ``incoming`` is older than ``stored`` (None: accept).

    A generation of -1 means "no group" and is not compared.
    """
    if stored is None:
        return
    a, b = stamp_of(incoming), stamp_of(stored)
    if a.generation < 0 or b.generation < 0:
        a = EpochStamp(a.layout_epochs, -1)
    why = a.older_than(b)
    if why:
        raise ZombieError(f"{what} rejected: stamped older than the stored one ({'; '.join(why)}): a zombie processor?")


def newer_epochs_needed(stamp: Any, cached: Mapping[str, int]) -> dict[str, int]:
    """Topics whose epoch in ``stamp`` is newer than the cached layouts' (re-read them)."""
    s = stamp_of(stamp)
    return {t: e for t, e in s.layout_epochs.items() if e > cached.get(t, 0)}
