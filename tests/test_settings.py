"""The latency preset: what it fills in, and what it leaves to explicit settings."""

from __future__ import annotations

import pytest

from streamkit.errors import ConfigError
from streamkit.settings import LOW_LATENCY, load_settings


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
