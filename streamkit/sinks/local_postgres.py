"""A PostgreSQL server of one's own, from the machine's binaries (Debian's package), in a
temporary directory: initdb, postgres on a free local port, stopped and removed at the
end. For the tests and benchmarks of the PostgreSQL sink (``.ci/run`` installs the
package). As root (CI) the server runs as ``nobody``: PostgreSQL refuses root."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["pg_bin", "postgres_server"]


def pg_bin() -> str | None:
    """The directory of the newest installed server's binaries (None: not installed)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return os.path.dirname(found[-1]) if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def postgres_server(bin_dir: str) -> Iterator[str]:
    """Start a server; yields its DSN (database ``postgres``, user ``streamkit``)."""
    base = tempfile.mkdtemp(prefix="streamkit-pg-")
    data = os.path.join(base, "data")
    user = "nobody" if os.geteuid() == 0 else None
    if user is not None:
        os.chmod(base, 0o777)
        shutil.chown(base, user)
    subprocess.run(
        [f"{bin_dir}/initdb", "-D", data, "-U", "streamkit", "--auth=trust", "-E", "UTF8", "--no-sync"],
        check=True, capture_output=True, user=user,
    )  # fmt: skip
    port = _free_port()
    log = open(os.path.join(base, "server.log"), "wb")  # noqa: SIM115 - open while the server runs
    server = subprocess.Popen(
        [f"{bin_dir}/postgres", "-D", data, "-p", str(port), "-k", base, "-c", "listen_addresses=127.0.0.1",
         "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
        stdout=log, stderr=subprocess.STDOUT, user=user,
    )  # fmt: skip
    dsn = f"host=127.0.0.1 port={port} user=streamkit dbname=postgres"
    try:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(dsn, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                assert server.poll() is None, open(os.path.join(base, "server.log")).read()
                assert time.monotonic() < deadline, "PostgreSQL did not accept connections in 30 s"
                time.sleep(0.1)
        yield dsn
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
        shutil.rmtree(base, ignore_errors=True)
