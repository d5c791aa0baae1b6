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
