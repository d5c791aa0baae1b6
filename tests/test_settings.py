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
