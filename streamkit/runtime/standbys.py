"""A worker's standby replicas: warm copies of other workers' processors' stores, kept
current from the changelog (``streamkit.state.standby``), handed to a member that is
assigned one of those processors.

One keeper per worker (its members share the state directory). The leader's assignment
names, per member, the processors it keeps standbys of (``assignors.standbys``); the
keeper keeps the union:

1. ``assign``: a new standby is opened from the store on disk (left by an earlier
   standby or active: it goes on from its changelog position) or restored from the
   changelog; one no longer assigned is closed and its store deleted (a stale copy would
   be opened as a store later).
2. ``follow``: every ``FOLLOW_SECONDS``, each copy reads its partition from where it is
   to the end and applies what markers closed. A copy whose lineage broke, or whose
   changelog lost records it had not read (compaction), is restored whole.
3. ``release``: a member about to open one of these processors as its active takes the
   copy: it is caught up to the partition's end first, then closed, and the member
   opens the store at the last marker (then reads the input from that marker's
   positions, as after a restore).

``copies`` is what the members tell the leader: every store on this disk with its
changelog position, so that the assignment prefers the warmest.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stores.base import StoreError, StoreLockedError
from stores.rocksdb import RocksDBStore
from streamkit.kafkaio import KafkaIO
from streamkit.state.changelog import position_of
from streamkit.state.restore import restore_store
from streamkit.state.standby import LineageBroken, StandbyCopy

log = logging.getLogger(__name__)

FOLLOW_SECONDS = 0.2
"""How often the copies read what their partitions gained."""
STORE_PREFIX = "processor-"
PROBE_SECONDS = 2.0
"""The least time between a member's assignment and its asking for the rebalance that moves
a caught-up warm-up copy to it (doubled after each one that did not)."""
RETRY_SECONDS = 2.0
"""How often a standby that could not start (no marker yet, its store held) tries again."""


@dataclass
class StandbyStatus:
    """One standby as ``status`` shows it."""

    position: int
    end: int
    state: str
    """"restoring", "catching up" or "warm" (it had read to the end at its last read)."""

    @property
    def lag(self) -> int:
        return max(0, self.end - self.position)


class StandbyKeeper:
    """The standby copies of one worker (see the module docstring)."""

    def __init__(
        self, app_dir: Path, tables: Mapping[str, Any], io: KafkaIO, topic: str, incarnation: str = ""
    ) -> None:
        self.app_dir = app_dir
        self.tables = tables
        self.io = io
        self.topic = topic
        self.incarnation = incarnation
        self.disk = f"{socket.gethostname()}:{app_dir.absolute()}"
        self.copies: dict[int, StandbyCopy] = {}
        self.status: dict[int, StandbyStatus] = {}
        self.on_disk: dict[int, int] = {}
        """Changelog positions of the stores found on disk and not kept (``scan``)."""
        self._wanted: dict[str, set[int]] = {}
        self._active: dict[str, set[int]] = {}
        self._retry_at: dict[int, float] = {}
        self._p0 = 1
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._claimed: set[int] = set()
        self._warmups: dict[str, tuple[set[int], Callable[[], None] | None, float]] = {}
        self._probes: dict[int, int] = {}
        """Rebalances asked for per warm-up processor that did not move it here yet."""
        """Processors a member took (``release``) since the last ``assign``: never started here."""
        self.restores = 0

    # -- what the members report and are given ------------------------------------------------
    def scan(self) -> None:
        """Read the changelog position of every store on this disk that no process holds."""
        for path in sorted(self.app_dir.glob(f"{STORE_PREFIX}*")):
            pid = _pid_of(path)
            if pid is None or pid in self.copies:
                continue
            try:
                with RocksDBStore.open(str(path), create=False) as store:
                    position = position_of(store.checkpoint())
            except (StoreLockedError, StoreError):
                continue
            if position is not None:
                self.on_disk[pid] = position

    def positions(self, hosted: Iterable[int] = ()) -> dict[int, int]:
        """Per processor whose store this disk holds (but those in ``hosted``): its changelog position."""
        out = dict(self.on_disk)
        out.update({pid: copy.position for pid, copy in self.copies.items()})
        for pid in hosted:
            out.pop(pid, None)
        return out

    def wanted(self) -> set[int]:
        """The processors this worker keeps standbys of: what its members were given, but
        those one of them hosts."""
        hosted = set().union(set(), *self._active.values())
        return set().union(set(), *self._wanted.values()) - hosted - self._claimed

    async def assign(
        self,
        member: str,
        pids: Iterable[int],
        active: Iterable[int],
        p0: int,
        warmups: Iterable[int] = (),
        rejoin: Callable[[], None] | None = None,
    ) -> None:
        """``member`` keeps standbys of ``pids`` now and hosts ``active``; of ``pids``, it
        is to take ``warmups`` over once their copies caught up: ``follow`` then calls
        ``rejoin`` (a rebalance, in which the leader moves them), at most once per
        assignment and less often after each one that did not move them."""
        self._p0 = p0
        self._wanted[member] = set(pids)
        self._active[member] = set(active)
        for pid in active:
            self._probes.pop(pid, None)  # taken over
        wait = PROBE_SECONDS * 2 ** min(8, max((self._probes.get(pid, 0) for pid in warmups), default=0))
        self._warmups[member] = (set(warmups), rejoin, time.monotonic() + wait)
        self._claimed.clear()  # (the members' rebalances run one at a time: its actives say it now)
        wanted = self.wanted()
        async with self._lock:
            for pid in sorted(set(self.copies) - wanted):  # its store stays: a member may open it next
                self._drop(pid, delete=False)
        for pid in wanted - set(self.copies):  # started by ``follow``, not in the member's rebalance
            self._retry_at.pop(pid, None)
        self._wake.set()

    def forget(self, member: str) -> None:
        """``member`` left: its standbys are someone else's now (dropped at the next ``assign``)."""
        self._wanted.pop(member, None)
        self._active.pop(member, None)
        self._warmups.pop(member, None)

    async def release(self, pid: int) -> bool:
        """Hand processor ``pid``'s copy over to a member opening it as its active: caught
        up to the partition's end, then closed (the store stays). A store of it on disk
        that is not kept (left by an earlier standby or active) is caught up the same way,
        or deleted if its lineage broke (the member then restores it). Whether a store
        caught up to the changelog's end is there now."""
        async with self._lock:
            self._claimed.add(pid)
            copy = self.copies.get(pid)
            if copy is None:
                path = self.app_dir / f"{STORE_PREFIX}{pid}"
                if not path.exists():
                    return False
                try:
                    copy = await asyncio.to_thread(StandbyCopy.open, pid, path, sorted(self.tables), self.incarnation)
                except StoreLockedError:
                    return False  # another worker on this disk still has it: the member waits for it
                except LineageBroken as exc:
                    log.info("processor %d: the store on disk is not in the changelog (%s); restoring it", pid, exc)
                    await asyncio.to_thread(shutil.rmtree, path, True)
                    return False
                self.copies[pid] = copy
            t0 = time.monotonic()
            try:
                await self._read_on(pid, copy)
            except LineageBroken as exc:  # the member restores it (no store) or reads the input
                log.info("standby of processor %d: %s; not used", pid, exc)
                self._drop(pid, delete=True)
                return False
            self._drop(pid, delete=False)
            log.info("standby of processor %d promoted at changelog position %d (caught up in %.3f s)", pid,
                     copy.position, time.monotonic() - t0)  # fmt: skip
            return True

    # -- keeping them ----------------------------------------------------------------------------
    async def follow(self, every: float = FOLLOW_SECONDS) -> None:
        """Keep every copy current until cancelled; a copy that fails a round is tried again."""
        while True:
            async with self._lock:
                for pid in sorted(self.copies):
                    copy = self.copies.get(pid)
                    if copy is None:
                        continue
                    try:
                        await self._read_on(pid, copy)
                    except LineageBroken as exc:
                        log.info("standby of processor %d: %s; restoring it from the changelog", pid, exc)
                        self._drop(pid, delete=True)
                        await self._start(pid)
                    except Exception as exc:  # noqa: BLE001 - a broker restarting: the next round
                        log.warning("standby of processor %d: reading the changelog failed: %s", pid, exc)
                now = time.monotonic()
                for pid in sorted(self.wanted() - set(self.copies)):  # no marker yet, or its store was locked
                    if now >= self._retry_at.get(pid, 0.0):
                        self._retry_at[pid] = now + RETRY_SECONDS
                        await self._start(pid)
            self._probe_warmups()
            self._wake.clear()
            try:
                async with asyncio.timeout(every):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _probe_warmups(self) -> None:
        """Ask for the rebalance that moves a warm-up here once its copy caught up."""
        now = time.monotonic()
        for member, (pids, rejoin, due) in list(self._warmups.items()):
            warm = sorted(pid for pid in pids if (st := self.status.get(pid)) is not None and st.state == "warm")
            if not warm or rejoin is None or now < due:
                continue
            log.info("warm-up copies of processors %s caught up: %s asks for a rebalance to take them over", warm,
                     member)  # fmt: skip
            for pid in warm:
                self._probes[pid] = self._probes.get(pid, 0) + 1
            self._warmups[member] = (pids, rejoin, float("inf"))  # once per assignment
            rejoin()

    async def _read_on(self, pid: int, copy: StandbyCopy) -> None:
        records, end = await self.io.read(self.topic, pid, copy.read_to)
        if records and records[0].offset != copy.read_to:
            raise LineageBroken(f"changelog records {copy.read_to}..{records[0].offset - 1} are gone (compacted)")
        if len(records) >= 2 and records[-1].offset - records[0].offset != len(records) - 1:
            raise LineageBroken("changelog records it had not read are gone (compacted)")
        await asyncio.to_thread(copy.apply, records)
        self.status[pid] = StandbyStatus(
            copy.position, max(end, copy.read_to), "warm" if copy.read_to >= end else "catching up"
        )

    async def _start(self, pid: int) -> None:
        """Open processor ``pid``'s copy from the store on disk, else restore it."""
        path = self.app_dir / f"{STORE_PREFIX}{pid}"
        self.on_disk.pop(pid, None)
        names = sorted(self.tables)
        if path.exists():
            try:
                self.copies[pid] = await asyncio.to_thread(StandbyCopy.open, pid, path, names, self.incarnation)
                self.status[pid] = StandbyStatus(self.copies[pid].position, self.copies[pid].position, "catching up")
                log.info("standby of processor %d kept here from its store on disk (changelog position %d)", pid,
                         self.copies[pid].position)  # fmt: skip
                return
            except StoreLockedError:  # a member of another worker on this disk hosts it
                return
            except (LineageBroken, StoreError) as exc:
                log.info("standby of processor %d: the store on disk is not usable (%s); restoring it", pid, exc)
                await asyncio.to_thread(shutil.rmtree, path, True)
        self.status[pid] = StandbyStatus(0, 0, "restoring")
        plan = await restore_store(self.io, self.topic, pid, path, self.tables, p0=self._p0,
                                   incarnation=self.incarnation, log_as="standby")  # fmt: skip
        self.restores += 1
        if plan is None:  # no marker yet: tried again by ``follow``
            return
        self.copies[pid] = await asyncio.to_thread(StandbyCopy.open, pid, path, names, self.incarnation)
        self.status[pid] = StandbyStatus(plan.position, plan.position, "catching up")
        log.info("standby of processor %d kept here, restored from the changelog (position %d)", pid, plan.position)

    def _drop(self, pid: int, *, delete: bool) -> None:
        copy = self.copies.pop(pid, None)
        self.status.pop(pid, None)
        if copy is not None:
            copy.close()
            if delete:
                shutil.rmtree(self.app_dir / f"{STORE_PREFIX}{pid}", ignore_errors=True)

    def report(self) -> dict[int, dict[str, Any]]:
        """What the heartbeat says of each standby."""
        return {
            pid: {"position": st.position, "lag": st.lag, "state": st.state} for pid, st in sorted(self.status.items())
        }

    def close(self) -> None:
        for pid in list(self.copies):
            self._drop(pid, delete=False)


def _pid_of(path: Path) -> int | None:
    suffix = path.name[len(STORE_PREFIX) :]
    return int(suffix) if suffix.isdigit() else None
