"""What every window should hold and which closes should fire, computed here from the
definitions alone (plain loops, no streamkit code): the reference the window tests
compare a worker's and the test driver's results with.

One processor's records in the order it applies them: ``(key, timestamp ms, value)``.
Stream time is the largest timestamp applied (the record's own included); a window
closes when stream time reaches its close time, after the record that got it there. A
record within the gap of a closed session is late (a closed session is final).
Every kind is summed: a record adds its value to each window it joins."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


@dataclass
class Result:
    windows: dict[tuple[str, int], int] = field(default_factory=dict)
    """(key, start) -> value of the windows held at the end (closed or not; count
    windows are deleted when they close)."""
    closes: dict[tuple[str, int], int] = field(default_factory=dict)
    """(key, start) -> the value each close saw, once per window."""
    late: int = 0
    late_at: list[int] = field(default_factory=list)
    """The indexes of the late records in the records given."""
    stored: dict[tuple[str, int], int] = field(default_factory=dict)
    """What the table stores where it differs from its windows (sliding windows): per
    (key, slot), the values added there: a record on time in the slot of its time, one
    whose own window had closed in a slot per (time, first window joined): the first such
    of a key in -2**62, the next in -2**62 + 1."""


def time_windows(records: list[tuple[str, int, int]], size: int, advance: int, grace: int) -> Result:
    out = Result()
    stream = -1
    due: list[tuple[int, str, int]] = []  # (close time, key, start) of the windows not closed
    for i, (key, ts, value) in enumerate(records):
        stream = max(stream, ts)
        starts = [s for s in range(ts - ts % advance, ts - size, -advance) if s >= 0]
        live = [s for s in starts if s + size + grace > stream]
        if not live:
            out.late += 1
            out.late_at.append(i)
        for s in live:
            if (key, s) not in out.windows:
                heapq.heappush(due, (s + size + grace, key, s))
            out.windows[(key, s)] = out.windows.get((key, s), 0) + value
        while due and due[0][0] <= stream:
            _, k, s = heapq.heappop(due)
            out.closes[(k, s)] = out.windows[(k, s)]
    return out


def sessions(records: list[tuple[str, int, int]], gap: int, grace: int) -> Result:
    out = Result()
    stream = -1
    live: dict[str, list[list[int]]] = {}  # key -> [[start, end, value]] not closed
    ended: dict[str, list[list[int]]] = {}  # key -> the closed ones: final
    for i, (key, ts, value) in enumerate(records):
        advanced, stream = ts > stream, max(stream, ts)
        mine = live.setdefault(key, [])
        near = [s for s in mine + ended.get(key, []) if s[0] - gap <= ts <= s[1] + gap]
        joined = [s for s in near if s in mine and s[1] + gap + grace >= stream]
        if len(joined) < len(near) or (not joined and ts + gap + grace < stream):  # next to a final one: late
            out.late += 1
            out.late_at.append(i)
        else:
            for s in joined:
                mine.remove(s)
                del out.windows[(key, s[0])]
            start = min([ts, *(s[0] for s in joined)])
            end = max([ts, *(s[1] for s in joined)])
            total = sum(s[2] for s in joined) + value
            mine.append([start, end, total])
            out.windows[(key, start)] = total
        for k, ss in live.items() if advanced else ():  # (only a newer stream time closes one)
            for s in list(ss):
                if s[1] + gap + grace < stream:
                    out.closes[(k, s[0])] = s[2]
                    ss.remove(s)
                    ended.setdefault(k, []).append(s)
    return out


def counts(records: list[tuple[str, int, int]], n: int, step: int) -> Result:
    out = Result()
    seen: dict[str, int] = {}
    for key, _, value in records:
        index = seen.get(key, 0)
        seen[key] = index + 1
        for i in range(index // step + 1):
            start = i * step
            if start <= index < start + n:
                out.windows[(key, start)] = out.windows.get((key, start), 0) + value
                if index == start + n - 1:
                    out.closes[(key, start)] = out.windows.pop((key, start))
    return out


def sliding(records: list[tuple[str, int, int]], size: int, grace: int) -> Result:
    """Kafka Streams' sliding windows: for each record at t, [t - size, t]; and
    [t + 1, t + 1 + size] when a record lies in it. Both ends included. A window is open
    until stream time passes its end + grace; a record joins every window holding it
    that is open when it comes (closed windows keep their value), so it is late only when
    every window that could hold it has closed (t + 1 + size + grace <= stream time); the
    window ending with it exists only if it was open then."""
    out = Result()
    stream = -1
    kept: dict[str, list[tuple[int, int, int]]] = {}  # key -> (time, value, first start joined)
    closed: set[tuple[str, int]] = set()
    due: list[tuple[int, str, int]] = []  # (close time, key, start) of windows seen open

    def windows(key: str, since: int = -(1 << 62)) -> dict[int, int]:
        """The key's windows; from ``since`` on: those of its records from that time on
        (every window still open holds only such records)."""
        added = [r for r in kept[key] if r[0] >= since]
        on_time = {t for t, _, first in added if first == t - size}
        found = {}
        for start in {t - size for t in on_time} | {t + 1 for t, _, _ in added}:
            inside = [v for t, v, first in added if start <= t <= start + size and first <= start]
            if inside:
                found[start] = sum(inside)
        return found

    for i, (key, ts, value) in enumerate(records):
        since = stream - 2 * size - grace - 2  # a window open before this record holds none older
        stream = max(stream, ts)
        first = max(ts - size, stream - grace - size)  # the earliest open window holding ts starts here
        if first > ts:
            out.late += 1
            out.late_at.append(i)
        else:
            kept.setdefault(key, []).append((ts, value, first))
            for start in windows(key, since):  # (only this key's windows changed)
                if (key, start) not in closed:
                    heapq.heappush(due, (start + size + 1 + grace, key, start))
        while due and due[0][0] <= stream:
            _, k, start = heapq.heappop(due)
            if (k, start) not in closed:
                closed.add((k, start))
                out.closes[(k, start)] = windows(k, since)[start]
    out.windows = {(k, start): total for k in kept for start, total in windows(k).items()}
    for k, added in kept.items():
        late_slots: dict[tuple[int, int], int] = {}
        for t, v, first in added:
            slot = t if first == t - size else late_slots.setdefault((t, first), -(1 << 62) + len(late_slots))
            out.stored[(k, slot)] = out.stored.get((k, slot), 0) + v
    return out
