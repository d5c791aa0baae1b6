"""The windows of the scaling job (``scale_app``, every kind) against a reference computed
from its input alone, whatever scaled or crashed: no key left out.

The reference keeps time per partition, as Kafka Streams does (a task per partition): each
partition's records in offset order, stream time the largest timestamp of the partition
so far, every kind applied as ``tests/windows/reference.py`` defines it. A processor that
reads several partitions applies them merged by timestamp, and then judges every record
as its own partition's clock would (the stream-time page says why), so its windows, late
records and closes must be the reference's, however its partitions were grouped, handed
over or restarted:

- every window the stores hold (closed or not) holds the reference's value, and no other
  window is held;
- the records reported late are exactly the reference's, table by table;
- every window the reference closes was sent, and every close sent carries the window's
  final value (a processor may close a window before its partition's clock reaches it,
  when another partition it reads is ahead: never with another value; after a crash a
  close may be sent again, with the same value).

The input topic must keep its partitions (no expansion: a key's records stay in one)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from streamkit.kafkaio import KafkaIO
from streamkit.windows import Count, Session, Sliding, Tumbling, WindowKind
from tests.runtime.scale_app import GRACE_S, OTHER_WINDOWS
from tests.runtime.scale_windows import TABLES, _stores
from tests.windows import reference

KINDS: dict[str, WindowKind] = {"per_second": Tumbling(1, grace=GRACE_S), **OTHER_WINDOWS}
Applied = list[tuple[str, int, int]]
Record = tuple[str, str, int]
"""(key, producer, seq): one input record, whichever copies of it the topic holds."""


def expected(kind: WindowKind, records: Applied) -> reference.Result:
    if isinstance(kind, Count):
        return reference.counts(records, kind.n, kind.step)
    if isinstance(kind, Session):
        return reference.sessions(records, kind.gap_ms, kind.grace_ms)
    if isinstance(kind, Sliding):
        return reference.sliding(records, kind.size_ms, kind.grace_ms)
    return reference.time_windows(records, kind.size_ms, kind.advance_ms, kind.grace_ms)  # type: ignore[attr-defined]


def partition_reference(records: list[Any]) -> tuple[dict[str, reference.Result], dict[str, set[Record]]]:
    """Per table: the reference over every partition, and the records it finds late."""
    parts: dict[int, list[Any]] = {}
    seen: set[Record] = set()
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        v = orjson.loads(r.value)
        ident = (r.key.decode(), v["p"], v["seq"])
        if ident not in seen:  # (a copy a producer wrote twice: applied once)
            seen.add(ident)
            parts.setdefault(r.partition, []).append((ident, r.timestamp))
    want = {t: reference.Result() for t in KINDS}
    late: dict[str, set[Record]] = {t: set() for t in KINDS}
    for part in parts.values():
        applied = [(ident[0], ts, 1) for ident, ts in part]
        for t, kind in KINDS.items():
            one = expected(kind, applied)
            assert not set(one.windows) & set(want[t].windows), "a key in two partitions: no reference"
            want[t].windows.update(one.windows)
            want[t].stored.update(one.stored)
            want[t].closes.update(one.closes)
            late[t].update(part[i][0] for i in one.late_at)
    return want, late


async def _read(broker: str, *topics: str) -> list[list[Any]]:
    async with KafkaIO(broker) as io:
        return [await io.read_topic(t) if await io.partition_count(t) is not None else [] for t in topics]


def _explain(key: str, start: int, records: list[Any], late: set[Record]) -> str:
    """What explains a window that differs: its key's records near it (partition@offset,
    time from the window's start, producer/seq, judged late) and where the records judged
    late that are not were (per partition, their times)."""
    near = [
        f"{r.partition}@{r.offset} t={r.timestamp - start} {v['p']}/{v['seq']}"
        + (" LATE" if (key, v["p"], v["seq"]) in late else "")
        for r in records
        if r.key.decode() == key and -3000 <= r.timestamp - start < 5000 and (v := orjson.loads(r.value))
    ]
    where: dict[int, list[int]] = {}
    for r in records:
        v = orjson.loads(r.value)
        if (r.key.decode(), v["p"], v["seq"]) in late:
            where.setdefault(r.partition, []).append(r.timestamp)
    spread = {p: (len(ts), min(ts) - start, max(ts) - start) for p, ts in sorted(where.items())}
    return f"\n{key} records near {start}: {near}\njudged late, not late: per partition (n, first, last) {spread}"


def verify_against_reference(
    broker: str, topic: str, out: str, state_dir: Path, processors: int
) -> tuple[dict[str, set[Record]], set[Record]]:
    """The checks above; returns the records the reference finds late per table, and those
    the producers marked late (``{"late": 1}`` in the value)."""
    records, late_sent, closes = asyncio.run(_read(broker, topic, f"{out}-late", f"{out}-closes"))
    want, want_late = partition_reference(records)
    held, _ = _stores(state_dir, processors, TABLES)

    got_late: dict[str, set[Record]] = {t: set() for t in KINDS}
    for r in late_sent:
        v = orjson.loads(r.value)
        got_late[v.get("table", "per_second")].add((r.key.decode(), v["p"], v["seq"]))
    sent: dict[str, dict[tuple[str, int], set[int]]] = {t: {} for t in KINDS}
    for r in closes:
        v = orjson.loads(r.value)
        sent[v.get("table", "per_second")].setdefault((r.key.decode(), v["start"]), set()).add(v["n"])

    for t in KINDS:
        windows = want[t].stored or want[t].windows  # (sliding windows are stored per record time)
        wrong = {
            w: (held[t].get(w), windows.get(w)) for w in set(held[t]) | set(windows) if held[t].get(w) != windows.get(w)
        }
        assert not wrong, f"{t}: {len(wrong)} windows differ (held, reference), e.g. {sorted(wrong.items())[:4]}" + (
            _explain(min(wrong)[0], min(wrong)[1], records, got_late[t] - want_late[t])
        )
        extra, missed = got_late[t] - want_late[t], want_late[t] - got_late[t]
        assert not extra and not missed, (
            f"{t}: {len(extra)} records judged late that are not (e.g. {sorted(extra)[:3]}), "
            f"{len(missed)} late ones not (e.g. {sorted(missed)[:3]})"
        )
        final = {**want[t].windows, **want[t].closes}
        unsent = sorted(set(want[t].closes) - set(sent[t]))
        assert not unsent, f"{t}: {len(unsent)} windows closed and never sent, e.g. {unsent[:4]}"
        off = {w: (ns, final.get(w)) for w, ns in sent[t].items() if ns != {final.get(w)}}
        assert not off, f"{t}: {len(off)} closes sent with another value than the final, e.g. {sorted(off.items())[:4]}"
    marked = {(r.key.decode(), v["p"], v["seq"]) for r in records if (v := orjson.loads(r.value)).get("late")}
    return want_late, marked
