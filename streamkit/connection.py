"""How streamkit connects to a cluster: one configuration for every client it opens.

A :class:`Connection` is the bootstrap address plus the security settings (TLS, mutual
TLS, SASL PLAIN / SCRAM / OAUTHBEARER). It is built once (from ``App(...)`` arguments
and ``STREAMKIT_*`` variables, from CLI options, or from a Kafka client properties
file with :func:`from_properties`) and handed to every client: the worker's consumers
and producers, :class:`streamkit.producer.Producer`, the layout registry and
coordinator, the progress log, the CLI commands. :meth:`Connection.client_kwargs` is
what each aiokafka client receives; the TLS context is built once.

Secrets (the SASL password, a key's password) are kept as pydantic ``SecretStr``:
they print as ``**********`` and :meth:`Connection.describe` never shows them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import SecretStr

from streamkit.errors import BrokerUnreachableError, ConfigError

__all__ = [
    "PROTOCOLS",
    "MECHANISMS",
    "Connection",
    "as_connection",
    "connect_failure",
    "from_properties",
    "quiet_bootstrap",
]

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
PROTOCOLS: tuple[str, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


@dataclass(frozen=True)
class Connection:
    """The bootstrap address and how to secure the connection to it."""

    bootstrap: str
    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str | None = None
    """CA bundle (PEM) that signs the brokers' certificates (None: the system's)."""
    ssl_certfile: str | None = None
    """Client certificate (PEM) for mutual TLS."""
    ssl_keyfile: str | None = None
    ssl_key_password: SecretStr | None = None
    ssl_check_hostname: bool = True
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_oauth_token_provider: Any = field(default=None, compare=False)
    """An ``aiokafka.abc.AbstractTokenProvider`` for OAUTHBEARER."""

    def __post_init__(self) -> None:
        for secret in ("sasl_password", "ssl_key_password"):
            if isinstance(value := getattr(self, secret), str):  # kept hidden however it was given
                object.__setattr__(self, secret, SecretStr(value))
        where = f"connection to {self.bootstrap}"
        if self.security_protocol not in PROTOCOLS:
            raise ConfigError(f"{where}: security protocol {self.security_protocol!r} is not one of {PROTOCOLS}")
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and self.sasl_mechanism not in MECHANISMS:
            raise ConfigError(f"{where}: SASL mechanism {self.sasl_mechanism!r} is not one of {MECHANISMS}")
        if sasl and self.sasl_mechanism == "OAUTHBEARER" and self.sasl_oauth_token_provider is None:
            raise ConfigError(f"{where}: OAUTHBEARER needs a token provider (App(sasl_oauth_token_provider=...))")
        if sasl and self.sasl_mechanism != "OAUTHBEARER" and not (self.sasl_username and self.sasl_password):
            raise ConfigError(f"{where}: SASL {self.sasl_mechanism} needs a username and a password")
        unused = [name for name in self._unused_by_protocol() if getattr(self, name) is not None]
        if unused:
            raise ConfigError(
                f"{where}: {', '.join(unused)} set, but security protocol {self.security_protocol} does not use "
                f"{'them' if len(unused) > 1 else 'it'}: set security_protocol (SSL, SASL_PLAINTEXT or SASL_SSL)"
            )
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"{where}: {name} {path} is not a file")

    def _unused_by_protocol(self) -> tuple[str, ...]:
        """The settings this connection's protocol would drop: one given that its protocol
        ignores (TLS files over PLAINTEXT, a SASL login over SSL) is a mistake. (A password
        alone is not: secrets are often handed to every process of a machine alike.)"""
        tls = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")
        sasl = ("sasl_mechanism", "sasl_username")
        return (() if self.tls else tls) + (() if self.security_protocol.startswith("SASL_") else sasl)

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @cached_property
    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=self.ssl_cafile)
        ctx.check_hostname = self.ssl_check_hostname
        if self.ssl_certfile:
            password = self.ssl_key_password.get_secret_value() if self.ssl_key_password else None
            ctx.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, password)
        return ctx

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for any aiokafka client (consumer, producer, admin, client)."""
        kw: dict[str, Any] = {"bootstrap_servers": self.bootstrap, "security_protocol": self.security_protocol}
        if self.tls:
            kw["ssl_context"] = self.ssl_context
        if self.security_protocol.startswith("SASL_"):
            kw["sasl_mechanism"] = self.sasl_mechanism
            if self.sasl_mechanism == "OAUTHBEARER":
                kw["sasl_oauth_token_provider"] = self.sasl_oauth_token_provider
            else:
                assert self.sasl_password is not None
                kw["sasl_plain_username"] = self.sasl_username
                kw["sasl_plain_password"] = self.sasl_password.get_secret_value()
        return kw

    def describe(self) -> str:
        """For logs and errors: address and protocol, never a secret."""
        if self.security_protocol == "PLAINTEXT":
            return self.bootstrap
        text = f"{self.bootstrap} ({self.security_protocol}"
        if self.security_protocol.startswith("SASL_"):
            who = f" as {self.sasl_username}" if self.sasl_username else ""
            text += f", {self.sasl_mechanism}{who}"
        return text + ")"

    def with_bootstrap(self, bootstrap: str) -> Connection:
        return replace(self, bootstrap=bootstrap)

    def __str__(self) -> str:
        return self.bootstrap


def as_connection(broker: str | Connection) -> Connection:
    """A bare bootstrap address is a plaintext connection."""
    return broker if isinstance(broker, Connection) else Connection(broker)


@contextlib.contextmanager
def quiet_bootstrap() -> Iterator[None]:
    """aiokafka logs each failed bootstrap attempt as an error; the caller reports it
    once, as one line (:func:`connect_failure`)."""
    logger = logging.getLogger("aiokafka")  # the client module logs under the package name
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


async def connect_failure(conn: Connection, timeout_s: float = 10.0) -> BrokerUnreachableError:
    """Why a client could not bootstrap from ``conn``, as one line: aiokafka only logs
    the cause and raises "Unable to bootstrap", so connect once more to the first
    address and name what failed (nothing listening, an untrusted certificate, a host
    name the certificate does not carry, a TLS handshake, a rejected login)."""
    from aiokafka.conn import create_conn
    from aiokafka.errors import KafkaConnectionError, KafkaError

    kw = conn.client_kwargs()
    kw.pop("bootstrap_servers")
    sasl = conn.security_protocol.startswith("SASL_")
    # aiokafka's SCRAM client fails with these on the server's "e=..." rejection
    rejected: tuple[type[Exception], ...] = (KeyError, ValueError) if sasl else ()
    host, _, port = conn.bootstrap.split(",")[0].strip().rpartition(":")
    try:
        async with asyncio.timeout(timeout_s):
            probe = await create_conn(host, int(port), request_timeout_ms=int(timeout_s * 1000), **kw)
    except ssl.SSLCertVerificationError as exc:
        if exc.verify_code == 62 or "mismatch" in str(exc.verify_message).lower():
            cause = f"its TLS certificate is not valid for the name {host!r}"
        else:
            cause = f"its TLS certificate is not trusted ({exc.verify_message}); check the CA file"
    except ssl.SSLError as exc:
        cause = f"the TLS handshake failed ({exc.reason or exc}); is the listener TLS?"
    except KafkaConnectionError as exc:
        cause = str(exc)
        if not conn.tls and "closed" in cause:
            cause = "it closed the connection unanswered: does the listener speak TLS (security protocol SSL)?"
        elif not conn.ssl_certfile and "closed" in cause:  # TLS 1.3 alerts after the handshake
            cause = "it closed the connection after the TLS handshake: does it require a client certificate?"
    except KafkaError as exc:
        cause = f"the login was rejected ({type(exc).__name__}: {exc})" if sasl else str(exc)
    except rejected:
        cause = f"the login as {conn.sasl_username!r} was rejected (a wrong user name or password?)"
    except (OSError, TimeoutError) as exc:
        cause = f"no answer ({exc or type(exc).__name__})"
    else:
        cause = await _metadata_failure(probe, sasl)
    return BrokerUnreachableError(f"cannot connect to Kafka at {conn.describe()}: {cause}")


async def _metadata_failure(probe: Any, sasl: bool) -> str:
    """The connection is up; why metadata could not be read over it."""
    from aiokafka.protocol.metadata import MetadataRequest

    try:
        await probe.send(MetadataRequest[0]([]))
    except Exception:  # noqa: BLE001 - any failure here has the same meaning for the user
        if not sasl:
            return "it closed the connection when asked without a login: does it require SASL?"
        return "it closed the connection when asked for the cluster's metadata"
    finally:
        probe.close()
    return "it answers, but the client could not read the cluster's metadata"


# -------------------------------------------------------------- client properties files

_JKS = ("ssl.keystore.location", "ssl.truststore.location", "ssl.keystore.type", "ssl.truststore.type")
_MAPPED = {
    "security.protocol": "security_protocol",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_key_password",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",  # librdkafka's spelling
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
}
_IGNORED = ("client.id", "session.timeout.ms", "acks", "client.dns.lookup")


def from_properties(path: Path) -> dict[str, Any]:
    """The connection settings in a Kafka client properties file (``bootstrap`` from
    ``bootstrap.servers``), as :class:`Connection` keyword arguments.

    Understood: ``bootstrap.servers``, ``security.protocol``, ``ssl.ca.location``,
    ``ssl.certificate.location``, ``ssl.key.location``, ``ssl.key.password``,
    ``ssl.endpoint.identification.algorithm`` (empty: no hostname check),
    ``sasl.mechanism``, ``sasl.username``, ``sasl.password``, and ``sasl.jaas.config``
    for PLAIN and SCRAM. A Java keystore property is refused with one line; any other
    property too, rather than silently ignored."""
    from jproperties import Properties

    props = Properties()
    try:
        with open(path, "rb") as fh:
            props.load(fh, "utf-8")
    except OSError as exc:
        raise ConfigError(f"client config {path}: {exc.strerror}") from None
    out: dict[str, Any] = {}
    for key, (value, _meta) in props.items():
        where = f"client config {path}: {key}"
        if key in _JKS:
            raise ConfigError(
                f"{where}: Java keystores are not read; export PEM files (keytool -exportcert -rfc, "
                "openssl pkcs12) and set ssl.ca.location, ssl.certificate.location, ssl.key.location"
            )
        if key == "bootstrap.servers":
            out["bootstrap"] = value.strip()
        elif key in _MAPPED:
            out[_MAPPED[key]] = value.strip()
        elif key == "ssl.endpoint.identification.algorithm":
            out["ssl_check_hostname"] = value.strip().lower() == "https"
        elif key == "sasl.jaas.config":
            out.update(_jaas(value, where))
        elif key not in _IGNORED:
            raise ConfigError(f"{where}: not a connection property streamkit knows")
    for secret in ("sasl_password", "ssl_key_password"):
        if secret in out:
            out[secret] = SecretStr(out[secret])
    return out


def _jaas(value: str, where: str) -> dict[str, str]:
    """username and password of a PlainLoginModule or ScramLoginModule line."""
    import shlex

    words = shlex.split(value.strip().rstrip(";"))
    if not words or not words[0].endswith(("PlainLoginModule", "ScramLoginModule")):
        raise ConfigError(f"{where}: only PlainLoginModule and ScramLoginModule are understood")
    found = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    if "username" not in found or "password" not in found:
        raise ConfigError(f"{where}: needs username=... and password=...")
    return {"sasl_username": found["username"], "sasl_password": found["password"]}
