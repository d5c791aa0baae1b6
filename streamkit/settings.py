"""Worker settings: App(...) arguments, overridable by STREAMKIT_* environment variables,
and by the command line above both."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STREAMKIT_", extra="forbid", allow_inf_nan=False)

    broker: str | None = Field(
        None, description="bootstrap address (host:port); None: the client properties file's, else none (refused)"
    )
    client_config: Path | None = Field(
        None, description="a Kafka client properties file: bootstrap.servers, security.protocol, ssl.*, sasl.*"
    )
    security_protocol: str | None = Field(None, description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")
    ssl_cafile: str | None = Field(None, description="CA bundle (PEM) for the brokers' certificates")
    ssl_certfile: str | None = Field(None, description="client certificate (PEM), for mutual TLS")
    ssl_keyfile: str | None = Field(None, description="client key (PEM), for mutual TLS")
    ssl_key_password: SecretStr | None = Field(None, description="the client key's password, if it is encrypted")
    ssl_check_hostname: bool | None = Field(None, description="check the broker's name in its certificate")
    sasl_mechanism: str | None = Field(None, description="PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER")
    sasl_username: str | None = Field(None, description="the SASL login's user name")
    sasl_password: SecretStr | None = Field(
        None, description="the SASL login's password (from the environment or the properties file, never the CLI)"
    )
    state_dir: Path = Field(Path(".streamkit"), description="where processor stores live")
    processors: int | None = Field(
        None, ge=1, description="the job's initial processor count; None: the first input topic's partitions"
    )
    commit_interval: float = Field(2.0, gt=0, description="seconds between checkpoints")
    changelog: bool = Field(
        True,
        description="write each checkpoint's state changes to the job's changelog topic, from which a store lost "
        "with its disk is restored without the input's history",
    )
    changelog_partitions: int = Field(
        64,
        ge=1,
        description="partitions the job's changelog is created with (one per processor; at least the job's "
        "processor count): how far the job may grow on a broker that cannot add partitions (CreatePartitions)",
    )
    standby_replicas: int = Field(
        0,
        ge=0,
        description="warm copies of each processor's store kept on other workers from the changelog (Kafka "
        "Streams' num.standby.replicas): a dead worker's processors go on from them instead of a restore "
        "(1 recommended in production; needs the changelog)",
    )
    acceptable_recovery_lag: int = Field(
        10_000,
        ge=0,
        description="with standby replicas: changelog records a worker's copy of a store may be behind and still "
        "take its processor over at a rebalance (Kafka Streams' acceptable.recovery.lag); a processor that balance "
        "would move to a worker further behind stays where it is warm while that worker warms a copy up",
    )
    commit_every: int = Field(200_000, ge=1, description="records between checkpoints at most")
    query_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="answer queries of state by key (GET /tables/TABLE/KEY) on this port, at query_bind (None: "
        "off); `streamkit worker --query-port`",
    )
    query_bind: str = Field(
        "127.0.0.1",
        description="the address the queries are served at: 127.0.0.1 (this machine only; workers on other machines "
        "cannot forward to this one), 0.0.0.0 or :: (every interface) or one of this machine's addresses, which "
        "needs query_token and query_tls_certfile (refused without them); `streamkit worker --query-bind`",
    )
    query_token: SecretStr | None = Field(
        None,
        min_length=1,
        description="when set, every query (forwarded ones between workers included) must carry "
        "the header `Authorization: Bearer TOKEN` (others get 401); every worker of the job needs the same token, "
        "and `streamkit query` sends it",
    )
    query_tls_certfile: str | None = Field(
        None, description="serve queries over HTTPS with this certificate (PEM; with query_tls_keyfile)"
    )
    query_tls_keyfile: str | None = Field(
        None,
        validate_default=True,
        description="the key (PEM) of query_tls_certfile: serve queries over HTTPS (with query_tls_certfile)",
    )
    query_tls_cafile: str | None = Field(
        None,
        description="CA bundle (PEM) that other workers' query certificates are checked against when forwarding, "
        "and by `streamkit query` (None: the system's trusted CAs)",
    )
    query_host: str | None = Field(
        None,
        description="the host name other workers and clients reach this worker's queries at (None: query_bind when "
        "it is one address, else this machine's host name); with TLS, a name its certificate holds",
    )
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="serve the worker's Prometheus metrics on this port, at metrics_bind (None: off); "
        "`streamkit worker --metrics-port`",
    )
    metrics_bind: str = Field(
        "127.0.0.1",
        description="the address the metrics are served at: 127.0.0.1 (this machine only), 0.0.0.0 or :: (every "
        "interface: for a Prometheus on another machine) or one of this machine's addresses; "
        "`streamkit worker --metrics-bind`",
    )
    processing: Literal["at_least_once", "exactly_once"] = Field(
        "at_least_once",
        description="'exactly_once': the handlers' output (and window closes, and timers') is committed with the "
        "processor's checkpoint, and records another exactly-once job sent are applied only once committed there: "
        "each is applied once through crashes, zombies and scaling, the output seen downstream one checkpoint "
        "later (see the exactly-once guide); 'at_least_once': output goes out as it is made, and a crash sends "
        "what followed the last checkpoint again",
    )
    close_on: Literal["stream", "wall"] = Field(
        "stream",
        description="what moves the stream time that closes windows: 'stream' (the records' timestamps only) or "
        "'wall' (also the wall clock, minus close_allowance: an idle key or partition still gets its windows "
        "closed and its close callbacks called)",
    )
    close_allowance: float = Field(
        5.0,
        ge=0,
        description="with close_on='wall': seconds the wall clock is held back (how late records may still arrive "
        "from a producer whose clock, or delivery, lags)",
    )
    max_task_idle_ms: int = Field(
        0,
        ge=-1,
        description="a processor reading several partitions (of one topic or several) applies their records in "
        "timestamp order, holding a partition that is ahead while another has records it has not fetched yet; this "
        "is how long it also waits for a partition that has none (Kafka Streams' max.task.idle.ms; once passed, "
        "that partition holds nothing back until it brings a record again; 0: not at all, -1: never waits, not even "
        "for records known to be unfetched)",
    )
    latency: Literal["throughput", "low"] = Field(
        "throughput",
        description="a preset of fetch_max_wait_ms, output_linger_ms, max_batch_records and gc_threshold: "
        "'throughput' (500, 5, 2,000, 50,000) or 'low' (5, 0, 1,000, 2,000); a setting given explicitly wins",
    )
    fetch_max_wait_ms: int = Field(
        500,
        ge=0,
        description="how long the broker may hold a fetch while too little data is waiting: a record that arrives "
        "at an idle partition waits up to this long before the worker sees it (fewer, fuller fetches: less CPU)",
    )
    output_linger_ms: float = Field(
        5.0, ge=0, description="how long handler output waits to fill a batch before it is sent to the broker"
    )
    max_batch_records: int = Field(
        2_000,
        ge=1,
        description="records handled between two looks at the checkpoint triggers (and at the consumer) at most: "
        "a batch's records, decoded values and headers stay in the CPU's caches while it is handled; 10,000 "
        "stamped records did not, and cost a third more CPU per record",
    )
    checkpoint_dirty_keys: int = Field(
        50_000,
        ge=1,
        description="checkpoint as soon as the processors of one group member have changed this many keys since "
        "the last checkpoint: a checkpoint's pause grows with the keys it writes (about 1.5 µs each) and the "
        "cache holds them until then; fewer keys per checkpoint cost throughput",
    )
    sink_rows_per_checkpoint: int = Field(
        5_000,
        ge=1,
        description="checkpoint as soon as the processors of one group member hold this many rows for sinks (an "
        "upsert sink's rows count once per key), or 512 KiB of them serialised, whichever comes first: a "
        "checkpoint keeps its rows in its changelog marker, one Kafka record (1 MB by default)",
    )
    layout_poll_interval: float = Field(
        0.2,
        gt=0,
        le=60,
        description="seconds between a worker's looks at the layout registry for layout changes, for its consumers "
        "and its output producer (at least 0.1 s for the producer); a consumer also learns of a change from a record "
        "stamped with a newer epoch",
    )
    layout_epoch_wait: float = Field(
        10.0,
        gt=0,
        le=600,
        description="seconds a worker waits for the layout registry to reach an epoch a record is stamped with "
        "before it dead-letters the record (reason unknown-epoch: mirrored from another cluster, or forged) and "
        "goes on; the epoch is asked for again a minute later",
    )
    session_timeout_ms: int = Field(
        10_000,
        ge=1000,
        le=1_800_000,
        description="how long the group waits for a silent worker before it moves its processors (at most 30 min, "
        "the longest a Kafka broker accepts by default: group.max.session.timeout.ms)",
    )
    heartbeat_interval_ms: int = Field(
        1_000, ge=100, description="how often a group member tells the group it lives (below session_timeout_ms)"
    )
    max_poll_interval_ms: int = Field(
        300_000, ge=1000, description="the longest a member may go between fetches before the group drops it"
    )
    fetch_max_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="bytes one fetch may bring, over all partitions (at least 1 KiB)"
    )
    max_partition_fetch_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="bytes one fetch may bring from one partition (at least 1 KiB, at most fetch_max_bytes)",
    )
    dead_letter_topic: str | None = Field(None, description="default: '<app>-dead-letters'")
    failure_alarm_after: int = Field(
        100, ge=1, description="consecutive handler failures after which the worker logs loudly"
    )
    state_cache_bytes: int = Field(
        256 << 20,
        ge=1 << 20,
        description="bytes the write-back caches of every table of every processor a worker hosts use together "
        "(after each checkpoint; between two, the keys written since the last one are kept too)",
    )
    rocksdb_block_cache_bytes: int = Field(
        48 << 20,
        ge=1 << 20,
        description="RocksDB's block cache, shared by every store of a worker (the write-back caches above hold "
        "the hot keys; at millions of keys most store reads are of keys the filters rule out)",
    )
    rocksdb_memtable_bytes: int = Field(
        64 << 20, ge=1 << 20, description="RocksDB's memtables of every store of a worker together"
    )
    store_open_timeout: float = Field(30.0, gt=0, description="seconds to wait for a store lock")
    max_ic_ranges: int = Field(
        10_000,
        ge=1,
        description="key-level concurrency: records handed over and not finished per partition at most "
        "(each can leave an IC range in a checkpoint); beyond it the worker waits for them before fetching more",
    )
    gc_threshold: int | None = Field(
        50_000,
        ge=100,
        description="the garbage collector's youngest-generation threshold while the worker runs; Python's 700 "
        "collects every few hundred records, each record being several objects (None: leave it as it is)",
    )
    bootstrap_rate: float | None = Field(
        None, gt=0, description="records/s at most that a joining processor replays (None: as fast as it can)"
    )

    @field_validator("query_tls_certfile", "query_tls_keyfile", "query_tls_cafile")
    @classmethod
    def _readable(cls, path: str | None, info: ValidationInfo) -> str | None:
        """A TLS file that cannot be read is refused at start, not at the first query."""
        if path is not None:
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
        if info.field_name == "query_tls_keyfile" and "query_tls_certfile" in info.data:
            if (info.data["query_tls_certfile"] is None) != (path is None):
                raise ValueError("HTTPS for queries needs both query_tls_certfile and query_tls_keyfile (or neither)")
        return path

    @model_validator(mode="after")
    def _servable(self) -> Settings:
        """Refuse what the group or the fetches cannot work with, naming both settings."""
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be below session_timeout_ms "
                f"({self.session_timeout_ms}): a member would miss its session between two heartbeats"
            )
        if self.max_partition_fetch_bytes > self.fetch_max_bytes:
            raise ValueError(
                f"max_partition_fetch_bytes ({self.max_partition_fetch_bytes}) must be at most fetch_max_bytes "
                f"({self.fetch_max_bytes})"
            )
        return self

    @model_validator(mode="after")
    def _latency_preset(self) -> Settings:
        """Fill in the low-latency preset's values for the settings not given explicitly."""
        if self.latency == "low":
            for name, value in LOW_LATENCY.items():
                if name not in self.model_fields_set:
                    setattr(self, name, value)
        return self


LOW_LATENCY: dict[str, Any] = {
    "fetch_max_wait_ms": 5,
    "output_linger_ms": 0.0,
    "max_batch_records": 1_000,
    "gc_threshold": 2_000,
}
"""The settings ``latency="low"`` changes, and their values there."""


COMMAND_LINE: dict[str, Any] = {}
"""Settings given on this process's command line (``streamkit worker --query-bind``...):
the operator's word for this process, so they win over ``App(...)`` arguments as well as
over ``STREAMKIT_*`` variables."""


def given_on_command_line(**values: Any) -> None:
    """Record the settings this process's command line gives (None: not given)."""
    COMMAND_LINE.update({name: value for name, value in values.items() if value is not None})


def forget_command_line() -> None:
    """A new command line: nothing given on it yet (a second ``main()`` in one process)."""
    COMMAND_LINE.clear()


def load_settings(app_name: str, given: dict[str, Any]) -> Settings:
    """``Settings(**given)`` under the command line's settings, with a validation failure
    as one line naming each setting, where its value came from (a command-line option, an
    ``App(...)`` argument or a ``STREAMKIT_*`` variable) and the value."""
    from pydantic import ValidationError

    from streamkit.errors import ConfigError

    overruled = {name: given[name] for name in COMMAND_LINE if name in given and given[name] != COMMAND_LINE[name]}
    if overruled:
        import logging

        logging.getLogger(__name__).info(
            "app %r: the command line's %s win over the App's %s",
            app_name,
            ", ".join(f"{n}={COMMAND_LINE[n]!r}" for n in overruled),
            ", ".join(f"{n}={v!r}" for n, v in overruled.items()),
        )
    given = {**given, **COMMAND_LINE}
    if mistyped := mistyped_variables(os.environ):
        raise ConfigError(f"app {app_name!r}: " + "; ".join(mistyped))
    try:
        return Settings(**given)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            if not err["loc"]:  # a check across settings: its message names them (the input would hold secrets)
                problems.append(err["msg"].removeprefix("Value error, "))
                continue
            field = ".".join(str(x) for x in err["loc"])
            env = f"STREAMKIT_{field.upper()}"
            if field in COMMAND_LINE:
                where = f"--{field.replace('_', '-')}"
            elif field in given:
                where = f"App({app_name!r}, {field}=...)"
            elif env in os.environ:
                where = f"environment variable {env}"
            else:
                where = "setting"
            if err["type"] == "extra_forbidden":  # a misspelt name: its value may be a secret, never shown
                problems.append(f"{where}: {field} is no setting{_did_you_mean(field)}")
                continue
            value = "..." if field in SECRETS else repr(err.get("input"))
            problems.append(f"{where}: {field}={value}: {err['msg']}")
        raise ConfigError(f"app {app_name!r}: " + "; ".join(problems)) from None


def _nearest(name: str) -> str | None:
    """The setting ``name`` nearly spells, if any."""
    import difflib

    meant = difflib.get_close_matches(name, Settings.model_fields, 1, 0.8)
    return meant[0] if meant else None


def _did_you_mean(name: str) -> str:
    """``: did you mean NAME?`` for the setting ``name`` nearly spells ("" for none)."""
    return f": did you mean {meant}?" if (meant := _nearest(name)) else ""


def mistyped_variables(environ: Mapping[str, str]) -> list[str]:
    """The ``STREAMKIT_*`` variables that are no setting but spell one nearly: each a
    line naming the setting meant. (A variable far from every setting is left alone:
    other tools and test harnesses use the prefix too.)"""
    found = []
    for variable in sorted(environ):
        name = variable.upper().removeprefix("STREAMKIT_").lower()
        if not variable.upper().startswith("STREAMKIT_") or name in Settings.model_fields:
            continue
        if meant := _nearest(name):
            found.append(f"environment variable {variable} is no setting: did you mean STREAMKIT_{meant.upper()}?")
    return found


SECRETS = ("sasl_password", "ssl_key_password", "query_token")
"""The settings whose values no message shows."""


CONNECTION_FIELDS = (
    "security_protocol",
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_key_password",
    "ssl_check_hostname",
    "sasl_mechanism",
    "sasl_username",
    "sasl_password",
)
"""The settings that say how to connect (beside ``broker`` and ``client_config``)."""


def connection_settings(settings: Settings, broker: str | None = None, token_provider: Any = None) -> Any:
    """The :class:`streamkit.connection.Connection` of ``settings`` to ``broker`` (else
    the settings' broker, else the properties file's ``bootstrap.servers``); None when
    no broker is named anywhere. A setting given here wins over the properties file."""
    from streamkit.connection import Connection, from_properties

    found: dict[str, Any] = from_properties(settings.client_config) if settings.client_config else {}
    found.update({k: v for k in CONNECTION_FIELDS if (v := getattr(settings, k)) is not None})
    bootstrap = broker or settings.broker or found.pop("bootstrap", None)
    found.pop("bootstrap", None)
    if bootstrap is None:
        return None
    return Connection(bootstrap, sasl_oauth_token_provider=token_provider, **found)
