"""Secure connections: the embedded broker behind TLS, every client through one
connection configuration, and one clear line for each way a connection fails."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from streamkit.broker import EmbeddedBroker
from streamkit.connection import Connection, from_properties
from streamkit.errors import BrokerUnreachableError, ConfigError
from streamkit.kafkaio import KafkaIO
from streamkit.producer import Producer
from streamkit.testing import unique_topic_name

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A throwaway CA, the broker's certificate for ``localhost``, and another CA."""
    d = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("localhost")
    files = {"ca": d / "ca.pem", "other": d / "other.pem", "cert": d / "server.pem", "key": d / "server.key"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    other.cert_pem.write_to_path(str(files["other"]))
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    return {k: str(v) for k, v in files.items()}


@pytest.fixture(scope="module")
def tls_broker(pki: dict[str, str]) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(tls=(pki["cert"], pki["key"])) as broker:
        yield broker


def _env(env: dict[str, str]) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")}, **env}


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamkit.cli", *args],
        cwd=ROOT,
        env=_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def start_cli(*args: str, **env: str) -> subprocess.Popen[str]:
    """A command left running (a worker), its output captured."""
    return subprocess.Popen(
        [sys.executable, "-m", "streamkit.cli", *args],
        cwd=ROOT,
        env=_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_produce_consume_and_expand_over_tls(tls_broker: EmbeddedBroker, pki: dict[str, str], tmp_path: Path) -> None:
    """The demo app's path over TLS: topics, the streamkit producer, a worker process,
    status, an expansion; plaintext is refused by the same listener."""
    conn = Connection(tls_broker.bootstrap, security_protocol="SSL", ssl_cafile=pki["ca"])
    topic = unique_topic_name("tls")
    env = {
        "STREAMKIT_BROKER": tls_broker.bootstrap,
        "STREAMKIT_SECURITY_PROTOCOL": "SSL",
        "STREAMKIT_SSL_CAFILE": pki["ca"],
        "STREAMKIT_STATE_DIR": str(tmp_path / "state"),
        "SK_TEST_TOPIC": topic,
    }
    created = cli("topics", "create", topic, "--partitions", "2", "--capacity", "4", **env)
    assert created.returncode == 0, created.stderr

    async def produce(n: int) -> None:
        async with Producer(conn, client_id="tls-test") as p:
            for i in range(n):
                await p.send(topic, f"k{i % 50}", {"n": i})
            await p.flush()

    asyncio.run(produce(500))
    worker = start_cli("worker", "tests.tls_app:app", **env)
    try:
        status = cli("status", "tests.tls_app:app", "--wait-caught-up", "60", **env)
        assert status.returncode == 0, status.stderr
        expanded = cli("topics", "expand", topic, "--partitions", "3", **env)
        assert expanded.returncode == 0, expanded.stderr
        asyncio.run(produce(300))
        status = cli("status", "tests.tls_app:app", "--wait-caught-up", "60", **env)
        assert status.returncode == 0 and topic in status.stdout, status.stderr
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    with pytest.raises(BrokerUnreachableError):
        asyncio.run(KafkaIO(tls_broker.bootstrap).start())  # plaintext to a TLS listener


@pytest.mark.parametrize(
    ("case", "expected"),
    [("wrong CA", "certificate is not trusted"), ("wrong host name", "not valid for the name '127.0.0.1'")],
)
def test_a_failed_handshake_is_one_line_naming_the_broker_and_the_cause(
    tls_broker: EmbeddedBroker, pki: dict[str, str], case: str, expected: str
) -> None:
    address = tls_broker.bootstrap
    ca = pki["other"] if case == "wrong CA" else pki["ca"]
    if case == "wrong host name":
        address = address.replace("localhost", "127.0.0.1")
    env = {"STREAMKIT_BROKER": address, "STREAMKIT_SECURITY_PROTOCOL": "SSL", "STREAMKIT_SSL_CAFILE": ca}
    proc = cli("topics", "describe", "orders", **env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: cannot connect to Kafka at {address} (SSL)") and expected in lines[0]


def test_a_client_properties_file_becomes_the_connection(tmp_path: Path, pki: dict[str, str]) -> None:
    props = tmp_path / "client.properties"
    props.write_text(
        "bootstrap.servers=kafka-1.example.com:9093\n"
        "security.protocol=SASL_SSL\n"
        f"ssl.ca.location={pki['ca']}\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" '
        'password="s3cr3t-pw";\n'
    )
    found = from_properties(props)
    conn = Connection(found.pop("bootstrap"), **found)
    kw = conn.client_kwargs()
    assert kw["security_protocol"] == "SASL_SSL" and kw["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kw["sasl_plain_username"] == "alice" and kw["sasl_plain_password"] == "s3cr3t-pw"
    assert kw["ssl_context"] is not None
    for shown in (conn.describe(), repr(conn), str(conn)):
        assert "s3cr3t-pw" not in shown
    props.write_text("bootstrap.servers=x:9093\nssl.truststore.location=/etc/kafka/truststore.jks\n")
    with pytest.raises(ConfigError, match="export PEM files"):
        from_properties(props)


KEY_PASSWORD = "k3y-pa55-Zq9"
SASL_PASSWORD = "sasl-pa55-Wx7"


@pytest.fixture(scope="module")
def client_pki(tmp_path_factory: pytest.TempPathFactory, pki: dict[str, str]) -> dict[str, str]:
    """A client certificate from a new CA, its key encrypted with ``KEY_PASSWORD``."""
    from cryptography.hazmat.primitives import serialization

    d = tmp_path_factory.mktemp("client-pki")
    ca = trustme.CA()
    cert = ca.issue_cert("streamkit-client")
    key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(KEY_PASSWORD.encode()),
    )
    files = {"client_ca": d / "client-ca.pem", "client_cert": d / "client.pem", "client_key": d / "client.key"}
    ca.cert_pem.write_to_path(str(files["client_ca"]))
    cert.cert_chain_pems[0].write_to_path(str(files["client_cert"]))
    files["client_key"].write_bytes(encrypted)
    return {**pki, **{k: str(v) for k, v in files.items()}}


def test_mutual_tls_and_no_secret_in_logs_status_or_dead_letters(client_pki: dict[str, str], tmp_path: Path) -> None:
    """A broker that requires client certificates; the worker connects with a properties
    file (an encrypted client key and its password), status with CLI options. Bad
    records are dead-lettered. No secret appears in the worker's log, status' output,
    the status topic or the dead letters; a client without a certificate gets one line."""
    from streamkit.runtime.status import STATUS_TOPIC
    from streamkit.testing import produce_json, read_topic

    pki = client_pki
    with EmbeddedBroker(tls=(pki["cert"], pki["key"]), tls_client_cafile=pki["client_ca"]) as broker:
        topic = unique_topic_name("mtls")
        props = tmp_path / "client.properties"
        props.write_text(
            f"bootstrap.servers={broker.bootstrap}\nsecurity.protocol=SSL\nssl.ca.location={pki['ca']}\n"
            f"ssl.certificate.location={pki['client_cert']}\nssl.key.location={pki['client_key']}\n"
            f"ssl.key.password={KEY_PASSWORD}\n"
        )
        options = ["--security-protocol", "SSL", "--ssl-cafile", pki["ca"]]
        options += ["--ssl-certfile", pki["client_cert"], "--ssl-keyfile", pki["client_key"]]
        env = {
            "STREAMKIT_BROKER": broker.bootstrap,
            "STREAMKIT_SSL_KEY_PASSWORD": KEY_PASSWORD,
            "STREAMKIT_SASL_PASSWORD": SASL_PASSWORD,  # unused over SSL, and still never shown
            "STREAMKIT_STATE_DIR": str(tmp_path / "state"),
            "SK_TEST_TOPIC": topic,
        }
        # connection options after the sub-command, as a newcomer writes them
        created = cli("topics", "create", topic, "--partitions", "2", *options, **env)
        assert created.returncode == 0, created.stderr
        conn = Connection(
            broker.bootstrap,
            security_protocol="SSL",
            ssl_cafile=pki["ca"],
            ssl_certfile=pki["client_cert"],
            ssl_keyfile=pki["client_key"],
            ssl_key_password=KEY_PASSWORD,
        )
        produce_json(conn, topic, [*((f"k{i % 20}", {"n": i}) for i in range(200)), ("bad", b"{not json")])
        worker = start_cli("--client-config", str(props), "worker", "tests.tls_app:app", "--log-level", "DEBUG", **env)
        try:
            status = cli(*options, "status", "tests.tls_app:app", "--wait-caught-up", "60", **env)
            assert status.returncode == 0, status.stderr
            assert "value-decode" in status.stdout, status.stdout
        finally:
            worker.terminate()
            out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        dead = read_topic(conn, "tls-test-app-dead-letters")
        assert [r.key for r in dead] == [b"bad"]
        heartbeats = read_topic(conn, STATUS_TOPIC)
        assert heartbeats
        shown = [out, err, status.stdout, status.stderr, created.stdout, created.stderr]
        shown += [repr(r.headers) + repr(r.value) for r in dead + heartbeats]
        for secret in (KEY_PASSWORD, SASL_PASSWORD):
            assert not [text for text in shown if secret in text]

        no_cert = cli("--security-protocol", "SSL", "--ssl-cafile", pki["ca"], "topics", "describe", topic, **env)
        lines = no_cert.stderr.strip().splitlines()
        assert no_cert.returncode == 1 and len(lines) == 1, no_cert.stderr
        assert "client certificate" in lines[0], lines[0]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_rejected_login_is_one_line_without_the_password(mechanism: str) -> None:
    """Tansu with authentication on refuses every login (it cannot hold users in memory
    storage, see EmbeddedBroker.authentication), so the client's SCRAM exchange runs
    against the real broker and is rejected, as a wrong password is."""
    with EmbeddedBroker(authentication=True) as broker:
        env = {
            "STREAMKIT_BROKER": broker.bootstrap,
            "STREAMKIT_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "STREAMKIT_SASL_MECHANISM": mechanism,
            "STREAMKIT_SASL_USERNAME": "alice",
            "STREAMKIT_SASL_PASSWORD": SASL_PASSWORD,
        }
        for command in (["topics", "describe", "orders"], ["worker", "tests.tls_app:app"]):
            proc = cli(*command, **env)
            errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]  # the worker logs too
            assert proc.returncode == 1 and len(errors) == 1, proc.stderr
            assert errors[0].startswith(f"error: cannot connect to Kafka at {broker.bootstrap} (SASL_PLAINTEXT, ")
            assert "login as 'alice' was rejected" in errors[0] and SASL_PASSWORD not in proc.stderr + proc.stdout
        plain = cli("topics", "describe", "orders", STREAMKIT_BROKER=broker.bootstrap)
        assert plain.returncode == 1 and "does it require SASL?" in plain.stderr, plain.stderr


def test_the_broker_command_serves_tls(pki: dict[str, str]) -> None:
    proc = start_cli("broker", "--tls-cert", pki["cert"], "--tls-key", pki["key"])
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("broker listening on localhost:"), first
        address = first.split()[-1]

        async def connect(conn: Connection) -> int | None:
            async with KafkaIO(conn) as io:
                return await io.partition_count("absent")

        assert asyncio.run(connect(Connection(address, security_protocol="SSL", ssl_cafile=pki["ca"]))) is None
        with pytest.raises(BrokerUnreachableError, match="TLS"):
            asyncio.run(connect(Connection(address)))
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def test_the_backfill_reads_the_cluster_over_tls(tls_broker: EmbeddedBroker, pki: dict[str, str]) -> None:
    """The Spark bridge's broker access (its checks before Spark starts) takes the same
    connection as every other client."""
    from streamkit.spark.preflight import read_cluster
    from streamkit.testing import create_topic

    conn = Connection(tls_broker.bootstrap, security_protocol="SSL", ssl_cafile=pki["ca"])
    topic = create_topic(conn, unique_topic_name("tls-bf"), 3)
    view = read_cluster(conn, "tls-backfill-app", [topic])
    assert view.topics[topic].read == (0, 1, 2) and view.job_p0 is None
