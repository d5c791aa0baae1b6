"""Fixtures of the Spark bridge tests: one local SparkSession for the whole suite.

JVM start costs seconds, so the session is created once (session scope) with 2 cores,
task retries allowed (``local[2,2]``: a failed task is retried once, as on a cluster)
and few shuffle partitions.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

# scripts/test installs the 'spark' extra: a missing pyspark is a broken setup, not a skip
import pyarrow  # noqa: E402,F401
import pyspark  # noqa: E402,F401
import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from streamkit.spark.session import local_session

    session = local_session(cores=2, max_task_failures=2, shuffle_partitions=4, app_name="streamkit-tests")
    yield session
    session.stop()


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    return d


@pytest.fixture
def bootstrap(request: pytest.FixtureRequest) -> Iterator[str]:
    """The suite's broker (fixture ``broker`` of tests/conftest.py) or an embedded one."""
    try:
        yield request.getfixturevalue("broker")
        return
    except pytest.FixtureLookupError:
        pass
    from streamkit.broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker.bootstrap


@pytest.fixture
def fresh_broker() -> Iterator[str]:
    """A broker of the test's own (0.5 s to start): topics named as the apps of
    ``bf_apps`` name them, holding exactly what the test writes."""
    from streamkit.broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker.bootstrap


def seed_topic(bootstrap: str, topic: str, partitions: int, events: list[tuple[Any, ...]]) -> None:
    """Create ``topic`` and write ``events`` ``(key, amount, partition, offset, ...)`` to
    their partitions in order, so that the log holds the history at its offsets."""
    from streamkit.testing import create_topic, produce_json

    create_topic(bootstrap, topic, partitions)
    produce_json(bootstrap, topic, [(e[0], {"amount": e[1]}, e[2]) for e in events])
