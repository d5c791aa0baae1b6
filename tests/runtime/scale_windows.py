"""The windows of the scaling job (``scale_app``) after a run: every kind, checked from
the stores, the input and the closes sent, whatever scaled, crashed or was paused.

Always:

- ``per_second`` (tumbling): each window holds its key's records of its second, the late
  ones left out (where no record of its key was late: see below);
- every time-window kind: each window that closed (its book says so) was sent;
- count windows: each key's full windows were sent, each with its n records.

With ``clean`` (a run without crashes or zombies): every close was sent once, with its
window's final value.

Stream time is the processor's: one reading two partitions judges one's records by the
other's times too, while the processor that takes its keys over rebuilds them from their
partition alone, and how partitions interleave differs from run to run (a crash, a
zombie's own fetches). So a record late for one may not be for another: the windows of
a key with a late record in a table are left out of the checks, and after a crash or a
zombie a close may have been sent early, before a record that another processor took
(a hopping window's record whose older window closed joins the newer one without being
reported late, so its values are checked only in clean runs). Records of producer "h"
are a Spark backfill's history: the windows it closed were recorded closed without
output (``backfill_replay``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from stores.rocksdb import RocksDBStore
from stores.serde import serde_for
from streamkit.kafkaio import KafkaIO
from streamkit.windows import Count, Sliding, WindowKeySerde, sliding
from tests.runtime.scale_app import GRACE_S, OTHER_WINDOWS

Window = tuple[str, int]
"""(key, start ms)"""
TABLES = ["per_second", *OTHER_WINDOWS]


async def _read(broker: str, *topics: str) -> list[list[Any]]:
    async with KafkaIO(broker) as io:
        return [await io.read_topic(t) if await io.partition_count(t) is not None else [] for t in topics]


def _stores(
    state_dir: Path, processors: int, tables: list[str]
) -> tuple[dict[str, dict[Window, Any]], dict[str, dict[str, Any]]]:
    """Per table: its entries ((key, start) -> value) and its book (key -> entry), every processor's."""
    keys = WindowKeySerde(serde_for("str"))
    data: dict[str, dict[Window, Any]] = {t: {} for t in TABLES}
    books: dict[str, dict[str, Any]] = {t: {} for t in TABLES}
    names = [n for t in tables for n in (t, f"{t}__windows")]
    for pid in range(processors):
        with RocksDBStore.open(str(state_dir / f"processor-{pid}"), names) as store:
            for t in tables:
                for k, v in store.items(t):
                    w = keys.loads(k)
                    assert w not in data[t], f"{t}: window {w} is in two processors' stores"
                    data[t][w] = orjson.loads(v)
                for k, v in store.items(f"{t}__windows"):
                    books[t][keys.loads(k)[0]] = orjson.loads(v)
    return data, books


def verify_windows(
    broker: str,
    topic: str,
    out: str,
    state_dir: Path,
    processors: int,
    seen: dict[str, Any],
    clean: bool,
    every_kind: bool,
) -> None:
    """The checks above; ``every_kind``: the job has ``OTHER_WINDOWS`` too (else per-second ones only)."""
    tables = TABLES if every_kind else ["per_second"]
    records, late, closes = asyncio.run(_read(broker, topic, f"{out}-late", f"{out}-closes"))
    data, books = _stores(state_dir, processors, tables)
    late_keys: dict[str, set[str]] = {t: set() for t in TABLES}
    late_ids: set[tuple[str, str, int]] = set()
    for r in late:
        v = orjson.loads(r.value)
        late_keys[v.get("table", "per_second")].add(r.key.decode())
        if "table" not in v:
            late_ids.add((r.key.decode(), v["p"], v["seq"]))
    sent: dict[str, dict[Window, list[int]]] = {t: {} for t in TABLES}
    for r in closes:
        v = orjson.loads(r.value)
        sent[v.get("table", "per_second")].setdefault((r.key.decode(), v["start"]), []).append(v["n"])
    historic = {r.key.decode() for r in records if orjson.loads(r.value)["p"] == "h"}

    _tumbling_holds_its_records(records, late_ids, data["per_second"])
    kinds: dict[str, tuple[dict[Window, int], set[Window]]] = {  # per table: values, and the closed windows
        "per_second": (data["per_second"], _closed_time_windows(data["per_second"], books["per_second"])),
    }
    if every_kind:
        kinds["hopping"] = (data["hopping"], _closed_time_windows(data["hopping"], books["hopping"]))
        kinds["session"] = (data["session"], _closed_sessions(books["session"]))
        kinds["sliding"] = _sliding(data["sliding"], books["sliding"], OTHER_WINDOWS["sliding"])  # type: ignore[arg-type]
    for t, (values, closed) in kinds.items():
        if clean:
            wrong = {
                w: (ns, values.get(w))
                for w, ns in sent[t].items()
                if w[0] not in late_keys[t] and {values.get(w)} != set(ns)
            }
            assert not wrong, (
                f"{t}: {len(wrong)} closes sent with another value than the final: {list(wrong.items())[:3]}"
            )
        lost = sorted(w for w in closed if w not in sent[t] and w[0] not in historic | late_keys[t])
        assert not lost, f"{t}: {len(lost)} windows closed without being sent, e.g. {lost[:5]}" + _around(
            lost[0], records, closes
        )
    if every_kind:
        _count_windows_sent(seen, sent["count"], historic)
    span = (max(r.timestamp for r in records) - min(r.timestamp for r in records)) / 1000 if records else 0
    quiet = [t for t in tables if not sent[t]]
    assert not quiet or span < GRACE_S + 3, f"{quiet}: no window closed in {span:.1f} s of records: untested"
    twice = {(t, w): ns for t, per in sent.items() for w, ns in per.items() if len(ns) > 1}
    assert not clean or not twice, f"{len(twice)} windows sent twice, e.g. {list(twice.items())[:3]}"


def _count_windows_sent(seen: dict[str, Any], sent: dict[Window, list[int]], historic: set[str]) -> None:
    """Each key's full count windows were sent, each with its n records."""
    count: Count = OTHER_WINDOWS["count"]  # type: ignore[assignment]
    full = {(k, i * count.n) for k, per in seen.items() for i in range(sum(c for c, _, _ in per.values()) // count.n)}
    lost = sorted(w for w in full if w not in sent and w[0] not in historic)
    assert not lost, f"count: {len(lost)} full windows not sent, e.g. {lost[:5]}"
    assert all(set(ns) == {count.n} for ns in sent.values()), "count: a window sent before it was full"


def _around(window: Window, records: list[Any], closes: list[Any]) -> str:
    """What explains a lost close: the key's records near the window (partition@offset,
    time, producer/seq) and the closes sent of its neighbours (processor)."""
    key, start = window
    near = [
        f"{r.partition}@{r.offset} t={r.timestamp - start} {v['p']}/{v['seq']}"
        for r in records
        if r.key.decode() == key and -3000 <= r.timestamp - start < 5000 and (v := orjson.loads(r.value))
    ]
    sent = [
        f"{v['start'] - start}:{v['n']}@{v.get('processor')}"
        for r in closes
        if r.key.decode() == key and "table" not in (v := orjson.loads(r.value)) and abs(v["start"] - start) <= 5000
    ]
    return f"\n{key} records near {start}: {near}\nits closes near it (start offset: n @ processor): {sent}"


def _tumbling_holds_its_records(
    records: list[Any], late_ids: set[tuple[str, str, int]], held: dict[Window, int]
) -> None:
    """Each per-second window holds its key's records of its second (those without a late record)."""
    counted: dict[Window, set[tuple[str, int]]] = {}
    with_late: set[Window] = set()
    for r in records:
        v = orjson.loads(r.value)
        window = (r.key.decode(), r.timestamp - r.timestamp % 1000)
        if (window[0], v["p"], v["seq"]) in late_ids:
            with_late.add(window)
        else:
            counted.setdefault(window, set()).add((v["p"], v["seq"]))  # (a stray's copy: counted once)
    wrong = {w: (held.get(w), len(ids)) for w, ids in counted.items() if w not in with_late and held.get(w) != len(ids)}
    assert not wrong, f"per_second: {len(wrong)} windows differ (held, records), e.g. {list(wrong.items())[:3]}"


def _closed_time_windows(data: dict[Window, int], books: dict[str, Any]) -> set[Window]:
    """Tumbling and hopping: a window no longer in its key's book closed."""
    open_ = {(key, w[0]) for key, entry in books.items() for w in entry["w"]}
    return {w for w in data if w not in open_}


def _closed_sessions(books: dict[str, Any]) -> set[Window]:
    """A session the book keeps as ended closed."""
    return {(key, w[0]) for key, entry in books.items() for w in entry["w"] if w[2] == 1}


def _sliding(data: dict[Window, int], books: dict[str, Any], kind: Sliding) -> tuple[dict[Window, int], set[Window]]:
    """Sliding windows, from their records' times (each window ending with a record, and
    each starting right after one when it holds a record) with their values, and those
    closed up to the book's mark."""
    values: dict[Window, int] = {}
    closed: set[Window] = set()
    for key, entry in books.items():
        for window in sliding.windows_of(kind, entry):
            values[(key, window.start)] = sum(data[(key, slot)] for slot in sliding.slots_in(entry, window))
            if kind.close_time(window) <= entry.get("c", -1):
                closed.add((key, window.start))
    return values, closed
