"""Resume positions and their owners: parsing positions, the topic layouts, the final
positions of a run (given and derived from the history), and which processors'
checkpoints each position is stamped into."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from streamkit.errors import ConfigError
from streamkit.spark.staging import BackfillError

if TYPE_CHECKING:
    from streamkit.spark.backfill_plan import BackfillPlan

__all__ = ["Positions", "parse_positions"]

Positions = Mapping[tuple[str, int], int]


def parse_positions(spec: Any) -> dict[tuple[str, int], int]:
    """Positions from ``{(topic, part): next}``, ``{topic: {part: next}}`` or strings
    ``"topic:part=next"`` (a list or one comma-separated string)."""
    out: dict[tuple[str, int], int] = {}
    if spec is None:
        return out
    if isinstance(spec, str):
        spec = [s for s in spec.split(",") if s.strip()]
    if isinstance(spec, Mapping):
        for k, v in spec.items():
            if isinstance(k, tuple):
                out[(str(k[0]), int(k[1]))] = int(v)
            elif isinstance(v, Mapping):
                for part, off in v.items():
                    out[(str(k), int(part))] = int(off)
            else:
                raise ConfigError(f"positions: cannot read {k!r}: {v!r}")
        return out
    for item in spec:
        m = re.fullmatch(r"\s*(.+):(\d+)=(\d+)\s*", str(item))
        if not m:
            raise ConfigError(f"position {item!r} must look like TOPIC:PARTITION=NEXT_OFFSET")
        out[(m.group(1), int(m.group(2)))] = int(m.group(3))
    return out


def _layouts(spec: Mapping[str, int | tuple[int, int]] | None) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for topic, v in (spec or {}).items():
        n0, n = (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))
        if not 1 <= n0 <= n:
            raise ConfigError(f"topic_partitions[{topic!r}] must be N or (N0, N) with 1 <= N0 <= N, got {v!r}")
        out[topic] = (n0, n)
    return out


def _stamp(
    plan: BackfillPlan, positions: Mapping[tuple[str, int], int], owners: Mapping[tuple[str, int], set[int]]
) -> tuple[dict[int, dict[tuple[str, int], int]], set[tuple[str, int]]]:
    """Which processors' checkpoints get which positions.

    A processor's checkpoint says "every record before these positions is reflected in
    this store", so a position goes to the processors that own keys of that partition,
    exactly as the runtime's own checkpoints hold only the partitions a processor reads:
    known from the history itself (rows of the partition placed on the processor) or,
    failing that, from the topic layout (``topic_partitions``). With neither, the
    position goes to every store (reported as a warning).
    """
    per_proc: dict[int, dict[tuple[str, int], int]] = {p: {} for p in range(plan.p)}
    layout_owners: dict[tuple[str, int], set[int]] = {}
    if plan.topic_partitions:
        from assignors.placement import assign_partitions

        assignment = assign_partitions(plan.topic_partitions, plan.p0, plan.p)
        for proc, slots in assignment.items():
            for topic, part, _filter in slots:
                layout_owners.setdefault((topic, part), set()).add(proc)
    for tp, procs in owners.items():
        expected = layout_owners.get(tp)
        if expected is not None and not procs <= expected:
            raise BackfillError(
                f"keys of {tp[0]}[{tp[1]}] in the history are placed on processor(s) {sorted(procs - expected)}, "
                f"but the topic layout gives that partition to {sorted(expected)}: the key bytes differ from the "
                "producer's (check the key serde / --key-encoded) or the producer used another partitioner"
            )
    everywhere: set[tuple[str, int]] = set()
    for tp, nxt in positions.items():
        owned = owners.get(tp) or layout_owners.get(tp)
        if owned is None and plan.topic_partitions and tp[0] in plan.topic_partitions:
            raise BackfillError(
                f"position {tp[0]}:{tp[1]} is outside topic {tp[0]!r}'s layout {plan.topic_partitions[tp[0]]}"
            )
        if owned is None:
            everywhere.add(tp)
            owned = set(range(plan.p))
        for proc in owned:
            per_proc[proc][tp] = nxt
    return per_proc, everywhere


def _final_positions(plan: BackfillPlan, max_off: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """The positions stamped into the stores (:func:`.preflight.check_final_positions`)."""
    from streamkit.spark.preflight import check_final_positions

    unknown = sorted({t for t, _ in [*plan.positions, *max_off]} - set(plan.app.input_topics))
    if unknown:
        raise BackfillError(
            f"positions name topic(s) {unknown} that app {plan.app.name!r} does not consume "
            f"(its input topics: {plan.app.input_topics})"
        )
    try:
        positions = check_final_positions(
            plan.positions, max_off, plan.cluster, plan.topics, from_start=plan.from_start
        )
    except ConfigError as exc:
        raise BackfillError(str(exc)) from None
    if not plan.from_start:
        covered = {t for t, _ in positions}
        missing = [t for t in plan.topics if t not in covered]
        if missing:
            how = (
                "the offset column had no values for it"
                if plan.derive_positions
                else "give positions (TOPIC:PARTITION=NEXT) or an offset column"
            )
            raise BackfillError(
                f"no resume position for topic(s) {missing}: processors would read them from their first "
                f"offset and count the history twice ({how}; or from_start=True if none of the history "
                "is in Kafka)"
            )
    return positions
