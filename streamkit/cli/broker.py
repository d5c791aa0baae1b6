"""``streamkit broker``: run the embedded Tansu broker in the foreground."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import typer


def broker(
    port: int = typer.Option(None, "--port", "-p", help="Port on 127.0.0.1 (default: a free one)."),
    keep_log: bool = typer.Option(False, "--keep-log", help="Keep the broker's log file after it stops."),
    tls_cert: Path | None = typer.Option(
        None, "--tls-cert", help="serve TLS with this certificate (PEM, for the name localhost)"
    ),
    tls_key: Path | None = typer.Option(None, "--tls-key", help="the certificate's key (PEM)"),
    tls_client_ca: Path | None = typer.Option(
        None, "--tls-client-ca", help="mutual TLS: clients must present a certificate this CA signed"
    ),
) -> None:
    """Run a Kafka-protocol broker (Tansu, in-memory storage) until Ctrl-C or SIGTERM.

    Prints its address first, as "broker listening on 127.0.0.1:PORT" (with TLS,
    "localhost:PORT", the name the certificate must carry). Everything is kept in
    memory: stopping the broker loses every topic.
    """
    from streamkit.cli import CliError

    if (tls_cert is None) != (tls_key is None) or (tls_client_ca is not None and tls_cert is None):
        raise CliError("broker: TLS needs both --tls-cert and --tls-key (and --tls-client-ca only with them)")
    tls = (str(tls_cert), str(tls_key)) if tls_cert is not None and tls_key is not None else None
    from streamkit.broker import EmbeddedBroker

    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum, _frame) -> None:
        received.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        embedded = EmbeddedBroker(
            port=port,
            keep_log=keep_log,
            tls=tls,
            tls_client_cafile=str(tls_client_ca) if tls_client_ca is not None else None,
        )
        try:
            print(f"broker listening on {embedded.bootstrap}", flush=True)
            secured = "" if tls is None else ", TLS" if tls_client_ca is None else ", mutual TLS"
            print(
                f"  pid {embedded.pid}, in-memory storage{secured}, log {embedded.log_path}; Ctrl-C to stop",
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
