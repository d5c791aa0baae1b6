"""What a backfill checks against the cluster before Spark starts and before anything is
written: the input topics' partitions and ends, the job's processor counts, and the
resume positions.

A position says "every record of this partition below it is in the history". So:

- every partition the job reads needs one (or ``from_start``: none of the history is
  in Kafka), an empty partition's being 0;
- a position above the partition's high watermark names records that do not exist
  (processors would skip everything below it for ever), and a partition that does not
  exist, or that nobody reads, cannot have one;
- where the history has an offset column, each partition's position is its largest
  offset + 1 exactly: a given position above it leaves a gap (records neither in the
  history nor read), one below it counts records twice.

Importable without pyspark.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from streamkit.connection import Connection
from streamkit.errors import ConfigError

__all__ = ["ClusterView", "TopicView", "check_final_positions", "check_given_positions", "read_cluster"]


@dataclass(frozen=True)
class TopicView:
    topic: str
    physical: int
    read: tuple[int, ...]
    """The partitions the job reads (ReadWrite and draining), all of them without a layout."""
    high_watermarks: dict[int, int]
    n0: int
    active: int
    epoch: int | None
    """The layout's epoch (None: the topic has no streamkit layout)."""


@dataclass(frozen=True)
class ClusterView:
    connection: Connection
    topics: dict[str, TopicView]
    job_p0: int | None = None
    job_p: int | None = None
    job_incarnation: str = ""

    def layout_epochs(self) -> dict[str, int]:
        return {t: v.epoch for t, v in self.topics.items() if v.epoch is not None}

    def topic_partitions(self) -> dict[str, tuple[int, int]]:
        return {t: (v.n0, v.active) for t, v in self.topics.items() if v.epoch is not None}


def read_cluster(
    connection: Connection, app_name: str, topics: Iterable[str], connect_timeout: float = 10.0
) -> ClusterView:
    """The input topics and the job's record, read once (one line if the broker is gone)."""
    from streamkit.broker.probe import describe_error, wait_for_broker

    if connection.security_protocol == "PLAINTEXT":  # the probe speaks plain Kafka; else the client says
        try:
            wait_for_broker(connection.bootstrap, connect_timeout)
        except Exception as exc:  # noqa: BLE001 - one line naming the address
            raise ConfigError(f"broker {connection.bootstrap} does not answer: {describe_error(exc)}") from None
    return asyncio.run(_read_cluster(connection, app_name, list(topics)))


async def _read_cluster(bootstrap: Connection, app_name: str, topics: list[str]) -> ClusterView:
    from streamkit.errors import TopicNotFoundError
    from streamkit.kafkaio import KafkaIO
    from streamkit.layout.model import PartitionMode
    from streamkit.layout.registry import LayoutRegistry
    from streamkit.runtime.jobmeta import read_job

    async with KafkaIO(bootstrap, client_id="streamkit-backfill") as io:
        try:
            counts = await io.partition_counts(topics)
        except TopicNotFoundError as exc:
            raise ConfigError(str(exc)) from None
        registry = LayoutRegistry(bootstrap, client_id="streamkit-backfill", io=io, create_topic=False)
        if await io.partition_count(registry.topic) is not None:  # else no layout was ever published
            await registry.refresh()
        views: dict[str, TopicView] = {}
        for topic, physical in counts.items():
            layout = registry.get(topic)
            if layout is None:
                read = tuple(range(physical))
                n0 = active = physical
                epoch = None
            else:
                read = tuple(p for p in range(layout.physical) if layout.mode(p) != PartitionMode.NONE)
                n0, active, epoch = layout.n0, layout.active, layout.epoch
            hws = await io.high_watermarks(topic, range(physical))
            views[topic] = TopicView(topic, physical, read, dict(hws), n0, active, epoch)
        job = await read_job(io, app_name)
    if job is None:
        return ClusterView(bootstrap, views)
    return ClusterView(bootstrap, views, job.p0, job.p, job.incarnation)


def _tp(topic: str, part: int) -> str:
    return f"{topic}:{part}"


def check_given_positions(
    given: Mapping[tuple[str, int], int],
    view: ClusterView,
    topics: Iterable[str],
    *,
    from_start: bool,
    derive: bool,
) -> dict[tuple[str, int], int]:
    """Refuse positions the cluster contradicts; returns them with each empty, unnamed
    partition's 0 added. ``derive``: an offset column gives the others (checked after the
    Spark job by :func:`check_final_positions`)."""
    topics = list(topics)
    errors: list[str] = []
    if from_start and given:
        errors.append(
            "from_start=True says none of the history is in Kafka, but positions were given: drop one of the two"
        )
    for (topic, part), nxt in sorted(given.items()):
        tv = view.topics.get(topic)
        if tv is None:
            errors.append(f"position {_tp(topic, part)}: the history is of {', '.join(topics)}, not of {topic!r}")
        elif not 0 <= part < tv.physical:
            errors.append(f"position {_tp(topic, part)}: {topic} has no partition {part} (it has 0..{tv.physical - 1})")
        elif part not in tv.read:
            errors.append(f"position {_tp(topic, part)}: the job does not read partition {part} of {topic} (mode None)")
        elif nxt > tv.high_watermarks.get(part, 0):
            errors.append(
                f"position {_tp(topic, part)}={nxt} is beyond the partition's end (high watermark "
                f"{tv.high_watermarks.get(part, 0)}): processors would skip every record below {nxt}"
            )
    if errors:
        raise ConfigError("; ".join(errors))
    out = dict(given)
    if from_start:
        return out
    missing: list[str] = []
    for topic in topics:
        tv = view.topics[topic]
        for part in tv.read:
            if (topic, part) in out:
                continue
            hw = tv.high_watermarks.get(part, 0)
            if hw == 0:
                out[(topic, part)] = 0  # empty: the only possible position
            elif not derive:
                missing.append(f"{_tp(topic, part)} (high watermark {hw})")
    if missing:
        raise ConfigError(
            f"no position for {len(missing)} partition(s): {', '.join(missing)}; every partition the job reads "
            "needs one (positions TOPIC:PARTITION=NEXT_OFFSET, or from_start=True if none of the history is in "
            "Kafka), or processors would read those partitions from the start and count the history twice"
        )
    return out


def check_final_positions(
    given: Mapping[tuple[str, int], int],
    max_offsets: Mapping[tuple[str, int], int],
    view: ClusterView | None,
    topics: Iterable[str],
    *,
    from_start: bool,
) -> dict[tuple[str, int], int]:
    """The positions the stores get: the given ones and those of the history's offset
    column (largest + 1), which must agree and fit the log."""
    errors: list[str] = []
    out = dict(given)
    for (topic, part), top in sorted(max_offsets.items()):
        derived = top + 1
        have = given.get((topic, part))
        if have is not None and have < derived:
            errors.append(
                f"{_tp(topic, part)}: the history holds offset {top} but the position given is {have}: records "
                f"{have}..{top} would be counted twice"
            )
        elif have is not None and have > derived:
            errors.append(
                f"{_tp(topic, part)}: the history ends at offset {top} but the position given is {have}: records "
                f"{derived}..{have - 1} are in neither the history nor what processors will read"
            )
        tv = view.topics.get(topic) if view is not None else None
        if tv is not None and derived > tv.high_watermarks.get(part, 0):
            errors.append(
                f"{_tp(topic, part)}: the history holds offset {top} but the partition ends at "
                f"{tv.high_watermarks.get(part, 0)} (high watermark): the offset column is not this topic's offsets"
            )
        out.setdefault((topic, part), derived)
    if errors:
        raise ConfigError("; ".join(errors))
    if view is not None and not from_start:
        missing = [
            f"{_tp(t, p)} (high watermark {view.topics[t].high_watermarks.get(p, 0)})"
            for t in topics
            if t in view.topics
            for p in view.topics[t].read
            if (t, p) not in out and view.topics[t].high_watermarks.get(p, 0) > 0
        ]
        if missing:
            raise ConfigError(
                f"no position for {len(missing)} partition(s): {', '.join(missing)}: the offset column has no "
                "rows of them; give their positions (TOPIC:PARTITION=NEXT_OFFSET)"
            )
    return out
