"""``streamkit broker``: run the embedded Tansu broker in the foreground."""

from __future__ import annotations

import signal
import sys
import threading

import typer


def broker(
    port: int = typer.Option(None, "--port", "-p", help="Port on 127.0.0.1 (default: a free one)."),
    keep_log: bool = typer.Option(False, "--keep-log", help="Keep the broker's log file after it stops."),
) -> None:
    """Run a Kafka-protocol broker (Tansu, in-memory storage) until Ctrl-C or SIGTERM.

    Prints its address first, as "broker listening on 127.0.0.1:PORT". Everything is
    kept in memory: stopping the broker loses every topic.
    """
    from streamkit.broker import EmbeddedBroker

    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum, _frame) -> None:
        received.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        embedded = EmbeddedBroker(port=port, keep_log=keep_log)
        try:
            print(f"broker listening on {embedded.bootstrap}", flush=True)
            print(
                f"  pid {embedded.pid}, in-memory storage, log {embedded.log_path}; Ctrl-C to stop",
                flush=True,
            )
            while not stop.wait(0.5):
                if not embedded.running:
                    tail = embedded.log_tail(3).replace("\n", " | ")
                    raise RuntimeError(f"broker exited unexpectedly (log: {tail or 'empty'})")
        finally:
            embedded.stop()
        print("broker stopped", file=sys.stderr, flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def register(app: typer.Typer) -> None:
    app.command("broker")(broker)
