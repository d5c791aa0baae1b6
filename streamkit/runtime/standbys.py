"""A worker's standby replicas: warm copies of other workers' processors' stores, kept
current from the changelog (``streamkit.state.standby``), handed to a member that is
assigned one of those processors.

One keeper per worker (its members share the state directory). The leader's assignment
names, per member, the processors it keeps standbys of (``assignors.standbys``); the
keeper keeps the union:

1. ``assign``: a standby no longer assigned is closed (its store stays: a member may
   open it later, and its position is reported); new ones are started by ``follow``,
   never inside a member's rebalance.
2. ``follow``: a new standby is opened from the store on disk (left by an earlier
   standby or active: it goes on from its changelog position) or restored from the
   changelog, each in a task of its own; every ``FOLLOW_SECONDS`` each copy reads its
   partition from where it is to the end and applies what markers closed. A copy whose
   lineage broke, or whose changelog lost records it had not read (compaction), is
   restored whole. An error in one copy is logged and tried again; it never stops the
   worker.
3. ``release``: a member about to open one of these processors as its active takes the
   copy: it is caught up to the partition's end first, then closed, and the member
   opens the store at the last marker (then reads the input from that marker's
   positions, as after a restore). It never raises: on any failure the member opens or
   restores the store as it would without standbys.
4. Warm-ups (KIP-441): a member given a processor's copy to take over once caught up
   asks for the rebalance that moves it when its warm-ups are caught up (all of them,
   or some after ``PROBE_ALL_WAIT``), at most once per ``PROBE_SECONDS`` per worker and
   less often after each rebalance that did not move them.

A store without a changelog position (a job from before changelogs, a backfill) is
never deleted or kept as a copy: it is the only place its state is.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stores.base import StoreError, StoreLockedError
from stores.rocksdb import RocksDBStore
from streamkit.kafkaio import KafkaIO
from streamkit.state.changelog import position_of
from streamkit.state.restore import ChangelogSource, restore_store
from streamkit.state.standby import LineageBroken, NotInChangelog, StandbyCopy

log = logging.getLogger(__name__)

FOLLOW_SECONDS = 0.2
"""How often the copies read what their partitions gained."""
RETRY_SECONDS = 2.0
"""How often a standby that could not start (no marker yet, its store held, an error) tries again."""
PROBE_SECONDS = 5.0
"""The least time between two rebalances a worker asks for to take caught-up warm-ups over
(doubled per warm-up after each one that did not move it)."""
PROBE_ALL_WAIT = 30.0
"""How long a member waits for all its warm-ups to catch up before asking for some."""
STORE_PREFIX = "processor-"


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


@dataclass
class _Warmups:
    pids: set[int]
    rejoin: Callable[[], None] | None
    since: float
    asked: bool = False


@dataclass
class _Tasks:
    """What runs beside the keeper's loop and must end before its stores close."""

    starting: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    applying: set[asyncio.Future[Any]] = field(default_factory=set)


class StandbyKeeper:
    """The standby copies of one worker (see the module docstring)."""

    def __init__(
        self,
        app_dir: Path,
        tables: Mapping[str, Any],
        io: KafkaIO,
        topic: str,
        incarnation: str = "",
        configure: Any = None,
    ) -> None:
        self.app_dir = app_dir
        self.tables = tables
        self.io = io
        self.topic = topic
        self.incarnation = incarnation
        self.configure = configure
        """The stores' RocksDB options (the worker's shared memory budget)."""
        self.disk = f"{socket.gethostname()}:{app_dir.resolve()}"
        self.copies: dict[int, StandbyCopy] = {}
        self.status: dict[int, StandbyStatus] = {}
        self.known: dict[int, int] = {}
        """Changelog positions of the stores on this disk not kept as copies (found at
        start, closed by a member, or a copy no longer assigned)."""
        self._wanted: dict[str, set[int]] = {}
        self._active: dict[str, set[int]] = {}
        self._claimed: set[int] = set()
        """Processors a member took (``release``) since the last ``assign``: never started here."""
        self._retry_at: dict[int, float] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._tasks = _Tasks()
        self._wake = asyncio.Event()
        self._warmups: dict[str, _Warmups] = {}
        self._probes: dict[int, int] = {}
        """Rebalances asked for per warm-up processor that did not move it here yet."""
        self._last_probe = 0.0
        self._p0 = 1

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
                self.known[pid] = position

    def note(self, pid: int, position: int | None) -> None:
        """A member closed its store of ``pid`` at this changelog position."""
        if position is not None:
            self.known[pid] = position

    def positions(self, hosted: Iterable[int] = ()) -> dict[int, int]:
        """Per processor whose store this disk holds (but those in ``hosted``): its changelog position."""
        out = dict(self.known)
        out.update({pid: copy.position for pid, copy in self.copies.items()})
        for pid in hosted:
            out.pop(pid, None)
        return out

    def wanted(self) -> set[int]:
        """The processors this worker keeps standbys of: what its members were given, but
        those one of them hosts or took."""
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
        is to take ``warmups`` over once their copies caught up (``rejoin``: how it asks
        for the rebalance that moves them)."""
        self._p0 = p0
        self._wanted[member] = set(pids)
        self._active[member] = set(active)
        self._claimed.clear()  # (the members' rebalances run one at a time: its actives say it now)
        for pid in active:
            self._probes.pop(pid, None)  # taken over
        self._warmups[member] = _Warmups(set(warmups), rejoin, time.monotonic())
        wanted = self.wanted()
        for pid in sorted(set(self.copies) - wanted):  # its store stays: a member may open it next
            async with self._lock_of(pid):
                self._drop(pid)
        for pid in wanted - set(self.copies):
            self._retry_at.pop(pid, None)
        self._wake.set()

    async def release(self, pid: int) -> bool:
        """Hand processor ``pid``'s copy over to a member opening it as its active: caught
        up to the partition's end, then closed (the store stays). A store of it on disk
        that is not kept (left by an earlier standby or active) is caught up the same way,
        or deleted if its lineage broke (the member then restores it). Whether a store
        caught up to the changelog's end is there now. Never raises."""
        self._claimed.add(pid)
        try:
            starting = self._tasks.starting.get(pid)
            if starting is not None:  # what it makes is what the member needs
                await asyncio.wait([starting])
            async with self._lock_of(pid):
                return await self._caught_up(pid)
        except Exception as exc:  # noqa: BLE001 - the member goes on as without standbys
            log.warning("processor %d: its copy on this disk could not be caught up (%s): opened as it is", pid, exc)
            async with self._lock_of(pid):
                self._drop(pid)
            return False

    async def _caught_up(self, pid: int) -> bool:
        copy = self.copies.get(pid)
        path = self._path(pid)
        if copy is None:
            if not path.exists():
                return False
            try:
                copy = await asyncio.to_thread(self._open, pid, path)
            except (StoreLockedError, NotInChangelog):
                return False  # another worker on this disk has it (the member waits), or it is not a copy
            self.copies[pid] = copy
        t0 = time.monotonic()
        try:
            await self._read_on(pid, copy)
        except LineageBroken as exc:  # the member restores it
            log.info("processor %d: the store on this disk is not on its changelog's chain (%s): restored", pid, exc)
            self._drop(pid, delete=True)
            return False
        self._drop(pid)
        log.info("standby of processor %d promoted at changelog position %d (caught up in %.3f s)", pid,
                 copy.position, time.monotonic() - t0)  # fmt: skip
        return True

    # -- keeping them ----------------------------------------------------------------------------
    async def follow(self, every: float = FOLLOW_SECONDS) -> None:
        """Keep every copy current, start the missing ones, probe the warm-ups; until cancelled."""
        while True:
            for pid in sorted(self.copies):
                async with self._lock_of(pid):
                    copy = self.copies.get(pid)
                    if copy is None:
                        continue
                    try:
                        await self._read_on(pid, copy)
                    except LineageBroken as exc:
                        log.info("standby of processor %d: %s; restoring it from the changelog", pid, exc)
                        self._drop(pid, delete=True)
                        self._retry_at.pop(pid, None)
                    except Exception as exc:  # noqa: BLE001 - a broker restarting: the next round
                        log.warning("standby of processor %d: reading the changelog failed: %s", pid, exc)
            now = time.monotonic()
            for pid in sorted(self.wanted() - set(self.copies) - set(self._tasks.starting)):
                if now >= self._retry_at.get(pid, 0.0):
                    self._retry_at[pid] = now + RETRY_SECONDS
                    self._tasks.starting[pid] = asyncio.create_task(self._start(pid), name=f"standby {pid}")
            self._probe_warmups(now)
            self._wake.clear()
            try:
                async with asyncio.timeout(every):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _start(self, pid: int) -> None:
        """Open processor ``pid``'s copy from the store on disk, else restore it; errors
        are logged (``follow`` tries again)."""
        try:
            async with self._lock_of(pid):
                if pid in self.copies or pid not in self.wanted():
                    return
                await self._open_or_restore(pid)
        except Exception as exc:  # noqa: BLE001 - tried again after RETRY_SECONDS
            log.warning("standby of processor %d could not start: %s", pid, exc)
            self.status.pop(pid, None)
        finally:
            self._tasks.starting.pop(pid, None)

    async def _open_or_restore(self, pid: int) -> None:
        path = self._path(pid)
        if path.exists():
            try:
                copy = await asyncio.to_thread(self._open, pid, path)
            except StoreLockedError:  # a member of another worker on this disk hosts it
                return
            except NotInChangelog:
                log.info("standby of processor %d not kept here: its store on this disk is not in the changelog", pid)
                return
            except StoreError as exc:
                log.info("standby of processor %d: the store on disk cannot be opened (%s); restoring it", pid, exc)
                await self._delete(pid)
            else:
                self._kept(pid, copy, "from its store on disk")
                return
        self.status[pid] = StandbyStatus(0, 0, "restoring")
        changelog = ChangelogSource(self.io, self.topic, self.tables, self._p0, self.incarnation)
        plan = await restore_store(changelog, pid, path, log_as="standby", configure=self.configure)
        if plan is None:  # no marker yet: tried again by ``follow``
            self.status.pop(pid, None)
            return
        self._kept(pid, await asyncio.to_thread(self._open, pid, path), "restored from the changelog")

    def _kept(self, pid: int, copy: StandbyCopy, how: str) -> None:
        self.copies[pid] = copy
        self.known.pop(pid, None)
        self.status[pid] = StandbyStatus(copy.position, copy.position, "catching up")
        log.info("standby of processor %d kept here, %s (changelog position %d)", pid, how, copy.position)

    async def _read_on(self, pid: int, copy: StandbyCopy) -> None:
        records, end = await self.io.read(self.topic, pid, copy.read_to)
        if end < copy.read_to:
            raise LineageBroken(f"the changelog ends at {end}, before the copy's {copy.read_to} (it was recreated)")
        if records and records[0].offset != copy.read_to:
            raise LineageBroken(f"changelog records {copy.read_to}..{records[0].offset - 1} are gone (compacted)")
        if len(records) >= 2 and records[-1].offset - records[0].offset != len(records) - 1:
            raise LineageBroken("changelog records it had not read are gone (compacted)")
        applying = asyncio.ensure_future(asyncio.to_thread(copy.apply, records))
        self._tasks.applying.add(applying)
        applying.add_done_callback(self._tasks.applying.discard)
        await asyncio.shield(applying)  # (a cancelled loop leaves it to end: ``aclose`` waits for it)
        state = "warm" if copy.read_to >= end else "catching up"
        self.status[pid] = StandbyStatus(copy.position, max(end, copy.read_to), state)

    def _probe_warmups(self, now: float) -> None:
        """Ask for the rebalance that moves caught-up warm-ups to their member."""
        if now - self._last_probe < PROBE_SECONDS:
            return
        for member, w in self._warmups.items():
            if not w.pids or w.rejoin is None or w.asked:
                continue
            warm = sorted(pid for pid in w.pids if (st := self.status.get(pid)) is not None and st.state == "warm")
            tries = max((self._probes.get(pid, 0) for pid in w.pids), default=0)
            waited = now - w.since
            if not warm or waited < PROBE_SECONDS * 2 ** min(8, tries):
                continue
            if len(warm) < len(w.pids) and waited < PROBE_ALL_WAIT:
                continue
            log.info("warm-up copies of processors %s caught up: %s asks for a rebalance to take them over", warm,
                     member)  # fmt: skip
            for pid in warm:
                self._probes[pid] = self._probes.get(pid, 0) + 1
            w.asked, self._last_probe = True, now
            w.rejoin()
            return

    # -- stores ----------------------------------------------------------------------------------
    def _path(self, pid: int) -> Path:
        return self.app_dir / f"{STORE_PREFIX}{pid}"

    def _open(self, pid: int, path: Path) -> StandbyCopy:
        return StandbyCopy.open(pid, path, sorted(self.tables), self.incarnation, self.configure)

    def _lock_of(self, pid: int) -> asyncio.Lock:
        return self._locks.setdefault(pid, asyncio.Lock())

    def _drop(self, pid: int, *, delete: bool = False) -> None:
        """Stop keeping ``pid``'s copy: its store closed, and kept (its position known) or deleted."""
        copy = self.copies.pop(pid, None)
        self.status.pop(pid, None)
        if copy is not None:
            copy.close()
            if not delete:
                self.known[pid] = copy.position
        if delete:
            self.known.pop(pid, None)
            shutil.rmtree(self._path(pid), ignore_errors=True)

    async def _delete(self, pid: int) -> None:
        self.known.pop(pid, None)
        await asyncio.to_thread(shutil.rmtree, self._path(pid), True)

    def report(self) -> dict[int, dict[str, Any]]:
        """What the heartbeat says of each standby."""
        return {
            pid: {"position": st.position, "lag": st.lag, "state": st.state} for pid, st in sorted(self.status.items())
        }

    async def aclose(self) -> None:
        """Stop the starts under way, wait for the applies in threads, close every copy."""
        for task in list(self._tasks.starting.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.starting.values(), *self._tasks.applying, return_exceptions=True)
        for pid in list(self.copies):
            self._drop(pid)


def _pid_of(path: Path) -> int | None:
    suffix = path.name[len(STORE_PREFIX) :]
    return int(suffix) if suffix.isdigit() else None
