"""Worker processes on this machine for ``streamkit autoscale --workers local``: started
and stopped to the count the controller wants, one that died restarted (a supervisor).
They stop (SIGTERM: a checkpoint, then they leave) when the controller dies, however it
dies: left running, they would be more than ``--max`` with the workers a restarted
controller starts."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from streamkit.broker.process import die_with_parent

__all__ = ["LocalWorkers"]

log = logging.getLogger(__name__)

STOP_SECONDS = 30.0
"""How long a stopped worker may take to checkpoint and leave before it is killed."""


class LocalWorkers:
    """``streamkit ROOT worker SPEC ARGS`` processes (``root``: the root command's options,
    the connection). ``logs``: a directory for their output (``w<n>.log``; default: this
    process's stderr)."""

    def __init__(
        self,
        spec: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        logs: Path | None = None,
        root: Sequence[str] = (),
    ) -> None:
        self.command = [sys.executable, "-m", "streamkit.cli", *root, "worker", spec, *args]
        self.env = dict(os.environ if env is None else env)
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0
        self.restarted = 0

    @property
    def count(self) -> int:
        """Workers running (or started and not yet stopped)."""
        return sum(p.poll() is None for p in self.procs)

    def scale_to(self, n: int) -> None:
        """Start workers up to ``n``, or stop the newest down to it (each checkpoints and
        leaves the group first: SIGTERM)."""
        self.procs = [p for p in self.procs if p.poll() is None]
        while len(self.procs) < n:
            self._start()
        while len(self.procs) > n:
            self._stop(self.procs.pop())

    def restart_dead(self) -> list[tuple[int, int]]:
        """Start a worker in place of each one that exited; their (pid, exit status)."""
        dead = [(p.pid, code) for p in self.procs if (code := p.poll()) is not None]
        if dead:
            self.procs = [p for p in self.procs if p.poll() is None]
            for pid, code in dead:
                log.warning("worker %d exited with status %d: starting another", pid, code)
                self._start()
                self.restarted += 1
        return dead

    def stop_all(self) -> None:
        while self.procs:
            self._stop(self.procs.pop())

    def _start(self) -> None:
        out = None
        if self.logs is not None:
            self.logs.mkdir(parents=True, exist_ok=True)
            out = open(self.logs / f"w{self.started}.log", "ab")  # noqa: SIM115 - the child holds it
        proc = subprocess.Popen(  # a worker outlives no controller (a new one would start more)
            self.command, env=self.env, stdout=out, stderr=subprocess.STDOUT if out else None,
            preexec_fn=die_with_parent(signal.SIGTERM, pool_thread=True),
        )  # fmt: skip
        if out is not None:
            out.close()
        self.procs.append(proc)
        self.started += 1
        log.info("started worker %d (%d running)", proc.pid, self.count)

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            log.warning("worker %d did not stop within %.0f s: killing it", proc.pid, STOP_SECONDS)
            proc.kill()
            proc.wait()
        log.info("stopped worker %d (%d running)", proc.pid, self.count)
