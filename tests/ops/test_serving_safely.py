"""Serving state safely, with real worker processes on the real broker: the query and
metrics servers listen on 127.0.0.1 unless told otherwise; with ``query_token`` every
query (forwarded ones included) needs the bearer token; with a certificate and key the
queries are served over HTTPS, and ``streamkit query`` checks the certificate."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import trustme

from streamkit.query import Client, QueryError
from streamkit.testing import create_topic, produce_json
from tests.ops.test_metrics import _wait
from tests.ports import listen_port
from tests.runtime.jobs import ROOT, Job, make_records, reference

TOKEN = "s3cret-token"


def _listening(pid: int, ports: set[int]) -> dict[int, list[str]] | None:
    """The addresses the process listens at on each of ``ports`` (None until all are)."""
    found: dict[int, list[str]] = {}
    for conn in psutil.Process(pid).net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port in ports:
            found.setdefault(conn.laddr.port, []).append(conn.laddr.ip)
    return found if set(found) == ports else None


def _outside_address() -> str | None:
    """One of this machine's IPv4 addresses other machines could reach (not loopback)."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return str(a.address)
    return None


def _answers(urls: list[str], keys: list[str], **kw: Any) -> list[tuple[str, str, dict[str, Any]]] | None:
    """Every key's answer from every worker (None while one is not there yet)."""

    async def ask_all() -> list[tuple[str, str, dict[str, Any]]]:
        out = []
        for url in urls:
            async with Client(url, **kw) as client:
                out += [(url, key, await client.get("stats", key)) for key in keys]
        return out

    try:
        return asyncio.run(ask_all())
    except QueryError:
        return None


def test_query_and_metrics_listen_on_loopback_only_by_default(broker: str, tmp_path: Path) -> None:
    topic = create_topic(broker, f"safe-{uuid.uuid4().hex[:8]}", 1)
    job = Job(broker, f"safe-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", 1)
    query_port, metrics_port = listen_port(), listen_port()
    outside = _outside_address()
    try:
        worker = job.start_worker(STREAMKIT_QUERY_PORT=str(query_port), STREAMKIT_METRICS_PORT=str(metrics_port))
        bound = _wait("both servers listening", lambda: _listening(worker.pid, {query_port, metrics_port}), 60,
                      shown=lambda: job.log(worker, 2000))  # fmt: skip
        refused = {}
        for port in (query_port, metrics_port):
            if outside is not None:
                with socket.socket() as s:
                    s.settimeout(5)
                    refused[port] = s.connect_ex((outside, port))
    finally:
        job.stop_all()
    assert bound == {query_port: ["127.0.0.1"], metrics_port: ["127.0.0.1"]}, bound
    assert outside is not None, f"this machine has no non-loopback IPv4 address to try: {psutil.net_if_addrs()}"
    # ECONNREFUSED: nothing listens at the machine's outside address on those ports
    assert refused == {query_port: 111, metrics_port: 111}, refused
    assert worker.returncode == 0, job.log(worker, 2000)


def test_a_query_token_is_needed_by_clients_and_by_forwarding_workers(broker: str, tmp_path: Path) -> None:
    topic = create_topic(broker, f"safe-{uuid.uuid4().hex[:8]}", 2)
    job = Job(broker, f"safe-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", 2)
    ports = [listen_port(), listen_port()]
    records = make_records(200, 12)
    expected = reference(records)
    keys = sorted(expected)
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        for port in ports:  # no query_host: the advertised URL is the bound 127.0.0.1
            job.start_worker(STREAMKIT_QUERY_PORT=str(port), STREAMKIT_QUERY_TOKEN=TOKEN)
        produce_json(broker, topic, records)

        def right() -> list[tuple[str, str, dict[str, Any]]] | None:
            found = _answers(urls, keys, token=TOKEN)
            return found if found and all(a["value"] == expected[k] for _, k, a in found) else None

        answers = _wait("every key answered right by both workers, with the token", right)

        async def refused(token: str | None) -> tuple[int, str]:
            async with Client(urls[0], retries=0, token=token) as client:
                with pytest.raises(QueryError) as exc:
                    await client.get("stats", keys[0])
                return exc.value.status, str(exc.value)

        without, wrong = asyncio.run(refused(None)), asyncio.run(refused("not-the-token"))
    finally:
        job.stop_all()
    assert all(w.returncode == 0 for w in job.workers), [job.log(w, 2000) for w in job.workers]
    assert without[0] == 401 and "no query token" in without[1], without
    assert wrong[0] == 401 and "wrong query token" in wrong[1], wrong
    served_by: dict[str, set[tuple[int, str]]] = {}
    for _, key, answer in answers:
        served_by.setdefault(key, set()).add((answer["processor"], answer["worker"]))
    # each key from one processor on one worker, whichever was asked: the other forwarded, with the token
    assert all(len(by) == 1 for by in served_by.values()), served_by
    assert len({worker for by in served_by.values() for _, worker in by}) == 2, served_by


def test_queries_over_https_are_checked_against_the_ca(broker: str, tmp_path: Path) -> None:
    ca, other_ca = trustme.CA(), trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile, cafile, wrong_cafile = (tmp_path / n for n in ("cert.pem", "key.pem", "ca.pem", "other.pem"))
    cert.cert_chain_pems[0].write_to_path(str(certfile))
    cert.private_key_pem.write_to_path(str(keyfile))
    ca.cert_pem.write_to_path(str(cafile))
    other_ca.cert_pem.write_to_path(str(wrong_cafile))
    topic = create_topic(broker, f"safe-{uuid.uuid4().hex[:8]}", 1)
    job = Job(broker, f"safe-{uuid.uuid4().hex[:8]}", topic, tmp_path / "state", 1)
    port = listen_port()
    tls = {"STREAMKIT_QUERY_TLS_CERTFILE": str(certfile), "STREAMKIT_QUERY_TLS_KEYFILE": str(keyfile)}

    def query(*extra: str) -> subprocess.CompletedProcess[str]:  # the URL from the worker's heartbeat
        return subprocess.run(
            [sys.executable, "-m", "streamkit.cli", "query", "tests.runtime.job_app:app", "stats", "k1", *extra],
            cwd=ROOT, env=job.env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    try:
        half = job.start_worker(STREAMKIT_QUERY_PORT=str(port), STREAMKIT_QUERY_TLS_CERTFILE=str(certfile))
        half.wait(60)
        job.start_worker(STREAMKIT_QUERY_PORT=str(port), **tls)
        produce_json(broker, topic, make_records(20, 3))
        _wait("the worker answers over HTTPS", lambda: _answers([f"https://127.0.0.1:{port}"], ["k1"], cafile=cafile))
        trusted = query("--cafile", str(cafile))
        untrusted = query("--cafile", str(wrong_cafile))
    finally:
        job.stop_all()
    refusal = [line for line in job.log(half).splitlines() if line.startswith("error:")]
    assert half.returncode not in (0, None) and len(refusal) == 1, job.log(half, 2000)
    assert "query_tls_certfile and query_tls_keyfile" in refusal[0], refusal
    assert trusted.returncode == 0 and '"processor"' in trusted.stdout, trusted.stdout + trusted.stderr
    lines = untrusted.stderr.strip().splitlines()
    assert untrusted.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), untrusted.stderr
    assert f"https://127.0.0.1:{port}" in lines[0] and "not trusted" in lines[0], lines
    assert "Error" not in lines[0] and "Traceback" not in untrusted.stderr, lines


def test_a_token_goes_over_https_or_to_this_machine_only() -> None:
    """A query URL comes from the heartbeats, which a writer to the cluster could forge:
    the token is never sent in plain text to another host."""
    from streamkit.ops.queries import _may_carry_token

    for url in ("https://worker-2:9500/tables/t/k", "http://127.0.0.1:9500/x", "http://[::1]:9500/x",
                "http://localhost:9500/x"):  # fmt: skip
        assert _may_carry_token(url), url
    for url in ("http://worker-2:9500/tables/t/k", "http://10.0.0.7:9500/x", "http://attacker.example/x"):
        assert not _may_carry_token(url), url
