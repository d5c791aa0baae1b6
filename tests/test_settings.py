"""Settings: the latency preset, and what is refused at start in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamkit.errors import ConfigError
from streamkit.ops.exposure import serving_problem
from streamkit.settings import LOW_LATENCY, connection_settings, load_settings

ROOT = Path(__file__).resolve().parents[1]


def test_the_low_latency_preset_fills_in_what_is_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    throughput = load_settings("a", {})
    low = load_settings("a", {"latency": "low"})
    for name, value in LOW_LATENCY.items():
        assert getattr(low, name) == value != getattr(throughput, name), name
    monkeypatch.setenv("STREAMKIT_FETCH_MAX_WAIT_MS", "20")
    mixed = load_settings("a", {"latency": "low", "max_batch_records": 300})
    assert (mixed.fetch_max_wait_ms, mixed.max_batch_records, mixed.output_linger_ms) == (20, 300, 0.0)


def test_an_unknown_latency_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMKIT_LATENCY", "fast")
    with pytest.raises(ConfigError) as err:
        load_settings("a", {})
    assert "environment variable STREAMKIT_LATENCY: latency='fast'" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {"STREAMKIT_FETCH_MAX_BYTES": "0"},
            "STREAMKIT_FETCH_MAX_BYTES: fetch_max_bytes='0': Input should be greater than or equal to 1024",
        ),
        (
            {"STREAMKIT_SESSION_TIMEOUT_MS": "2000000000"},
            "session_timeout_ms='2000000000': Input should be less than or equal to 1800000",
        ),
        ({"STREAMKIT_SESSION_TIMEOUT_MS": "5000", "STREAMKIT_HEARTBEAT_INTERVAL_MS": "5000"}, "must be below"),
        ({"STREAMKIT_FETCH_MAX_BYTES": "100000", "STREAMKIT_MAX_PARTITION_FETCH_BYTES": "200000"}, "at most"),
    ],
)
def test_settings_the_runtime_cannot_serve_are_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], says: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as err:
        load_settings("a", {})
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def _pem(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.write_text("-----BEGIN CERTIFICATE-----\n")  # read at start; loaded when the server starts
    return str(path)


def test_state_served_beyond_this_machine_needs_a_token_and_tls(tmp_path: Path) -> None:
    """Asked when a worker starts: the commands that only read a job load the same App."""
    wide = {"query_port": 9500, "query_bind": "0.0.0.0", "sasl_password": "hunter2-secret"}
    said = serving_problem(load_settings("a", wide))
    assert said is not None and "query_bind='0.0.0.0'" in said and "query_token and query_tls_certfile" in said
    assert "hunter2" not in said and "\n" not in said, said
    said = serving_problem(load_settings("a", {**wide, "query_token": "t"}))
    assert said is not None and "needs query_tls_certfile and query_tls_keyfile" in said, said
    tls = {"query_tls_certfile": _pem(tmp_path, "c.pem"), "query_tls_keyfile": _pem(tmp_path, "k.pem")}
    assert serving_problem(load_settings("a", {**wide, "query_token": "t", **tls})) is None
    for here in ("127.0.0.1", "127.0.0.2", "::1", "0:0:0:0:0:0:0:1", "localhost"):
        assert serving_problem(load_settings("a", {"query_port": 9500, "query_bind": here})) is None, here
    for there in ("::ffff:127.0.0.1", "", "my-host", "10.0.0.7"):
        assert serving_problem(load_settings("a", {"query_port": 9500, "query_bind": there})) is not None, there
    assert serving_problem(load_settings("a", {"query_bind": "0.0.0.0"})) is None  # nothing served
    said = serving_problem(load_settings("a", {"query_port": 9500, "metrics_port": 9500}))
    assert said == "query_port and metrics_port are both 9500: each needs a port of its own"


def test_an_empty_query_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty token (a secret whose key is missing) would let every query in."""
    monkeypatch.setenv("STREAMKIT_QUERY_TOKEN", "")
    with pytest.raises(ConfigError) as err:
        load_settings("a", {})
    assert "STREAMKIT_QUERY_TOKEN" in str(err.value) and "at least 1" in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"close_allowance": float("inf")}, "close_allowance=inf: Input should be a finite number"),
        ({"output_linger_ms": float("nan")}, "output_linger_ms=nan: Input should be a finite number"),
    ],
)
def test_arguments_the_runtime_cannot_serve_are_refused_in_one_line(given: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings("a", given)
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_mistyped_variable_is_refused_naming_the_setting_meant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMKIT_HISTORIES", "3")  # far from every setting: another tool's, left alone
    assert load_settings("a", {}).commit_interval == 2.0
    monkeypatch.setenv("STREAMKIT_COMMIT_INTERVALL", "30")
    monkeypatch.setenv("STREAMKIT_QUERYPORT", "8080")
    with pytest.raises(ConfigError) as err:
        load_settings("a", {})
    said = str(err.value)
    assert "STREAMKIT_COMMIT_INTERVALL is no setting: did you mean STREAMKIT_COMMIT_INTERVAL?" in said, said
    assert "STREAMKIT_QUERYPORT is no setting: did you mean STREAMKIT_QUERY_PORT?" in said, said
    assert "\n" not in said


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "u", "sasl_password": "pw-x77"}, "sasl_mechanism, "),
        ({"security_protocol": "SSL", "sasl_mechanism": "PLAIN"}, "sasl_mechanism set, but security protocol SSL"),
        ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_username": "u",
          "sasl_password": "pw-x77", "ssl_cafile": "CA"}, "ssl_cafile set, but security protocol SASL_PLAINTEXT"),
    ],
)  # fmt: skip
def test_security_settings_the_protocol_would_drop_are_refused(
    tmp_path: Path, given: dict[str, str], says: str
) -> None:
    if "ssl_cafile" in given:
        given = {**given, "ssl_cafile": _pem(tmp_path, "ca.pem")}
    with pytest.raises(ConfigError) as err:
        connection_settings(load_settings("a", given), "127.0.0.1:9092")
    said = str(err.value)
    assert says in said and "set security_protocol" in said and "\n" not in said, said
    assert "pw-x77" not in said  # no secret


def test_the_command_line_wins_over_the_apps_arguments(tmp_path: Path) -> None:
    """`streamkit worker --query-bind 127.0.0.1` serves at this machine only, whatever the
    App says: run with no broker, the worker gets as far as asking for one only when the
    command line's bind was taken over the App's (which alone is refused)."""
    (tmp_path / "wide_app.py").write_text(
        "import streamkit\napp = streamkit.App('wide', query_port=9500, query_bind='0.0.0.0')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])

    def worker(*options: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "streamkit.cli", "worker", "wide_app:app", *options],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        return [line for line in done.stderr.splitlines() if line.startswith("error:")]

    alone = worker()
    assert len(alone) == 1 and "query_bind='0.0.0.0' serves the tables' state beyond this machine" in alone[0], alone
    narrowed = worker("--query-bind", "127.0.0.1")
    assert len(narrowed) == 1 and "no broker" in narrowed[0], narrowed


def test_a_timer_needs_a_finite_interval() -> None:
    import streamkit

    app = streamkit.App("a")
    for seconds in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="positive, finite interval"):
            app.every(seconds)


def test_the_command_lines_connection_reaches_the_workers_a_command_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """`streamkit --broker B autoscale APP --workers local`: its workers get the root's
    options as options (which win over the App's arguments there too), not as variables."""
    from streamkit.autoscale.local_workers import LocalWorkers
    from streamkit.cli import root_options
    from streamkit.settings import forget_command_line, given_on_command_line

    monkeypatch.setattr("streamkit.settings.COMMAND_LINE", {})
    given_on_command_line(broker="prod:9092", security_protocol="SSL", query_port=9500, ssl_cafile=None)
    workers = LocalWorkers("a:app", ["--members", "2"], root=root_options())
    assert workers.command[3:] == [
        "--broker", "prod:9092", "--security-protocol", "SSL", "worker", "a:app", "--members", "2",
    ]  # fmt: skip
    forget_command_line()  # a second command line in the same process starts afresh
    assert root_options() == []


def test_a_misspelt_argument_is_named_with_the_setting_meant_and_never_its_value() -> None:
    """Its value may be a secret (``sasl_pasword=...``): an error line must not show it."""
    with pytest.raises(ConfigError) as err:
        load_settings("a", {"sasl_pasword": "hunter2-x9", "comit_interval": 5, "zzz": 1})
    said = str(err.value)
    assert "hunter2-x9" not in said and "\n" not in said, said
    assert "App('a', sasl_pasword=...): sasl_pasword is no setting: did you mean sasl_password?" in said, said
    assert "comit_interval is no setting: did you mean commit_interval?" in said, said
    assert "zzz is no setting;" not in said and said.endswith("zzz is no setting"), said


def test_a_secret_setting_refused_is_named_without_its_value() -> None:
    with pytest.raises(ConfigError) as err:
        load_settings("a", {"sasl_password": 98765432})
    said = str(err.value)
    assert "sasl_password=...: Input should be a valid string" in said and "98765432" not in said, said
