"""Standby replicas: where each processor's warm copies go, and which member a processor
whose host left should go to (Kafka Streams' high-availability assignor, KIP-441, in
small).

A *disk* is where a worker keeps its stores (its host and state directory): workers
sharing one share their stores, so a copy on the active's disk is no copy at all.
Members report, per processor, the changelog position of the copy their disk holds (a
standby kept current, or a store left from before): the further, the warmer.

Pure functions of what the members reported, so that the leader's answer depends on
nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from assignors.placement import assign_processors_to_members

__all__ = ["ACCEPTABLE_LAG", "place_actives", "place_standbys"]


def _by_disk(disks: Mapping[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for member in sorted(disks):
        out.setdefault(disks[member], []).append(member)
    return out


def _best_copies(disks: Mapping[str, str], copies: Mapping[str, Mapping[int, int]]) -> dict[int, dict[str, int]]:
    """Per processor, per disk: the furthest changelog position a member there reported."""
    best: dict[int, dict[str, int]] = {}
    for member, held in copies.items():
        disk = disks.get(member)
        if disk is None:
            continue
        for pid, position in held.items():
            per_disk = best.setdefault(pid, {})
            per_disk[disk] = max(position, per_disk.get(disk, -1))
    return best


ACCEPTABLE_LAG = 10_000
"""Changelog records a copy may be behind the furthest and still take its processor over
(Kafka Streams' ``acceptable.recovery.lag``): it catches them up in well under a second."""


def place_actives(
    hosted: Mapping[str, Sequence[int]],
    disks: Mapping[str, str],
    copies: Mapping[str, Mapping[int, int]],
    p: int,
    together: Sequence[Sequence[int]] = (),
    acceptable_lag: int = ACCEPTABLE_LAG,
) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Processors onto members, and the *warm-ups*: copies to keep so that a processor
    can move later without a restore (KIP-441's high-availability assignment).

    ``hosted``: each member's processors before; ``copies``: per member, the changelog
    position of every store its disk holds (its actives' included). The balanced, sticky
    target (``assign_processors_to_members``) is taken where the target's disk holds a
    copy within ``acceptable_lag`` of the furthest one. Elsewhere the processor goes to
    its warmest place (its previous host if alive, else the disk with the furthest
    copy), and the target gets a warm-up of it: once that copy is caught up, the target
    asks for a rebalance and takes the processor (``acceptable_lag`` met then)."""
    target = assign_processors_to_members(hosted, p, together)
    target_of = {pid: m for m, ids in target.items() for pid in ids}
    before = {pid: m for m, ids in hosted.items() for pid in ids}
    best = _best_copies({m: d for m, d in disks.items() if m in hosted}, copies)
    actives: dict[str, list[int]] = {m: [] for m in hosted}
    warmups: dict[str, list[int]] = {m: [] for m in hosted}
    for pid in range(p):
        goal = target_of[pid]
        held = best.get(pid, {})
        furthest = max(held.values(), default=None)
        warm = before.get(pid)
        if warm is None and furthest is not None:  # of the members that reported the furthest copy
            reporters = [m for m in hosted if copies.get(m, {}).get(pid) == furthest]
            warm = min(reporters, key=lambda m: (len(actives[m]), m))
        caught_up = (
            furthest is None
            or held.get(disks[goal], -1) >= furthest - acceptable_lag
            or (warm is not None and disks[warm] == disks[goal])  # the same store: no copy to warm up
        )
        if warm is None or warm == goal or caught_up:
            actives[goal].append(pid)
        else:
            actives[warm].append(pid)
            warmups[goal].append(pid)
    return actives, warmups


def place_standbys(
    active: Mapping[str, Sequence[int]],
    disks: Mapping[str, str],
    copies: Mapping[str, Mapping[int, int]],
    replicas: int,
    p: int,
) -> dict[str, list[int]]:
    """Per member, the processors it keeps a standby copy of: ``replicas`` per processor
    at most, each on a disk other than its active's and than its other copies'; fewer
    when there are too few disks. A disk that already holds a copy is preferred (the
    furthest first), as long as it keeps no more than its share; the rest go to the
    disks keeping fewest. On a disk, the member keeping fewest takes it."""
    result: dict[str, list[int]] = {m: [] for m in active}
    if replicas <= 0 or not active:
        return result
    members_on = _by_disk({m: d for m, d in disks.items() if m in active})
    disk_of = {m: disks[m] for m in active}
    active_disk = {pid: disk_of[m] for m, ids in active.items() for pid in ids}
    best = _best_copies(disk_of, copies)
    share = math.ceil(p * replicas / max(1, len(members_on)))
    load = dict.fromkeys(members_on, 0)
    for pid in range(p):
        home = active_disk.get(pid)
        chosen: list[str] = []
        for _ in range(replicas):
            free = [d for d in members_on if d != home and d not in chosen]
            if not free:
                break
            warm = [d for d in free if d in best.get(pid, {}) and load[d] < share]
            if warm:
                disk = max(warm, key=lambda d: (best[pid][d], -load[d], d))
            else:
                disk = min(free, key=lambda d: (load[d], d))
            chosen.append(disk)
            load[disk] += 1
            member = min(members_on[disk], key=lambda m: (len(result[m]), m))
            result[member].append(pid)
    return {m: sorted(ids) for m, ids in result.items()}
