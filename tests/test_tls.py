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


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")}
    return subprocess.run(
        [sys.executable, "-m", "streamkit.cli", *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
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
    worker = subprocess.Popen(
        [sys.executable, "-m", "streamkit.cli", "worker", "tests.tls_app:app"],
        cwd=ROOT,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")}, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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
