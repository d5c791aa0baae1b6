"""Local workers die with their controller, however it dies (SIGKILL, the OOM killer):
left running, a restarted controller would start ``--min`` more beside them, and its
scale decisions would count only its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CONTROLLER = textwrap.dedent(
    """
    import asyncio, sys, time
    from streamkit.autoscale.local_workers import LocalWorkers

    workers = LocalWorkers("unused:app")
    workers.command = [sys.executable, "-c", sys.argv[1]]  # a stand-in worker: says how it was stopped

    async def main() -> None:
        await asyncio.to_thread(workers.scale_to, 1)  # from a pool thread, as the controller does
        print(workers.procs[0].pid, flush=True)
        await asyncio.sleep(120)

    asyncio.run(main())
    """
)

WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    def stopped(*_):  # (written whole, then named: the test reads it as soon as it is there)
        with open(sys.argv[1] + ".tmp", "w") as f:
            f.write("SIGTERM")
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
        sys.exit(0)
    signal.signal(signal.SIGTERM, stopped)
    open(sys.argv[1] + ".up", "w").close()
    time.sleep(120)
    """
)


def test_a_local_worker_is_told_to_stop_when_its_controller_is_killed(tmp_path: Path) -> None:
    said = tmp_path / "said"
    worker = f"import sys; sys.argv = ['w', {str(said)!r}]\n{WORKER}"
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, worker], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert controller.stdout is not None
    pid = int(controller.stdout.readline())
    try:
        deadline = time.monotonic() + 30
        while not Path(f"{said}.up").exists():
            assert time.monotonic() < deadline, "the stand-in worker did not start"
            time.sleep(0.05)
        controller.send_signal(signal.SIGKILL)
        controller.wait()
        while not said.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert said.exists() and said.read_text() == "SIGTERM", "the worker outlived its controller"
    finally:
        controller.kill()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
