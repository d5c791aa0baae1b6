"""Suite-wide fixtures: one broker per test session, unique topics, produce/read helpers.

    broker         session-scoped bootstrap address ("host:port"): $STREAMKIT_TEST_BROKER
                   if set (checked to answer), else an EmbeddedBroker (Tansu, in memory)
                   stopped at the end of the session.
    topic_factory  make(partitions=1, *, prefix="t", configs=None) -> unique topic name,
                   created explicitly on the session broker.
    produce        produce(topic, records, **kw) -> count: streamkit.testing.produce_json
                   bound to the session broker.
    read_all       read_all(topic, **kw) -> list[ConsumerRecord]: streamkit.testing.read_topic
                   bound to the session broker (up to each partition's fetch high watermark).

The same helpers, without fixtures, are in ``streamkit.testing``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from aiokafka import ConsumerRecord

from streamkit.broker import resolve_broker
from streamkit.testing import Record, create_topic, produce_json, read_topic, unique_topic_name

# pytest-xdist's worker processes run with COLUMNS=80 and LINES=24 set, which every CLI a
# test starts would take for its terminal's size (`status` lays its tables out for 80
# columns then). A test that wants a width sets COLUMNS itself.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


@pytest.fixture(scope="session")
def broker() -> Iterator[str]:
    """Bootstrap address of the suite's broker."""
    with resolve_broker(os.environ.get("STREAMKIT_TEST_BROKER") or None) as handle:
        yield handle.bootstrap


@pytest.fixture
def topic_factory(broker: str) -> Callable[..., str]:
    """``make(partitions=1, *, prefix="t", configs=None) -> name``: a new, uniquely named topic."""

    def make(partitions: int = 1, *, prefix: str = "t", configs: Mapping[str, str] | None = None) -> str:
        return create_topic(broker, unique_topic_name(prefix), partitions, configs=configs)

    return make


@pytest.fixture
def produce(broker: str) -> Callable[..., int]:
    """``produce(topic, records, **kw) -> count`` (see ``streamkit.testing.produce_json``)."""

    def _produce(topic: str, records: list[Record], **kwargs: Any) -> int:
        return produce_json(broker, topic, records, **kwargs)

    return _produce


@pytest.fixture
def read_all(broker: str) -> Callable[..., list[ConsumerRecord]]:
    """``read_all(topic, **kw) -> records`` (see ``streamkit.testing.read_topic``)."""

    def _read(topic: str, **kwargs: Any) -> list[ConsumerRecord]:
        return read_topic(broker, topic, **kwargs)

    return _read


SCALING_UNDER_LOAD = (
    "tests/autoscale/test_step_load.py",
    "tests/exactly_once/test_pipeline.py",
    "tests/joins/test_stream_joins.py",
    "tests/ops/test_live_scale.py",
    "tests/runtime/test_layout_soak.py",
    "tests/runtime/test_scaling.py",
    "tests/runtime/test_scaling_reference.py",
    "tests/runtime/test_spread_after_growth.py",
)
"""The test modules that run several worker processes through scaling steps under load,
with short session timeouts. Their tests are marked ``alone``: ``scripts/test`` runs them
after the others, one at a time, with the machine to themselves (on 2 cores, beside other
multi-process tests, their workers miss heartbeats, the group churns, and a scale step
outlasts its limit). When ``scripts/test`` is given arguments it runs one pass, and its
test processes still never run two of these modules at once (the scheduler below)."""


LONGEST_FIRST = (
    "tests/spark/test_backfill_guide.py",
    "tests/state/test_standbys.py",
    "tests/spark/test_spark_e2e.py",
    "tests/windows/test_windows_worker.py",
    "tests/runtime/test_shared_tasks.py",
    "tests/test_readme_tour.py",
    "tests/spark/test_spark_scale_seed.py",
    "tests/runtime/test_strays.py",
    "tests/state/test_changelog_restore.py",
    "tests/test_cli.py",
    "tests/spark/test_backfill_refusals.py",
    "tests/test_tls.py",
)
"""The slowest test modules (``--durations``), handed out first by ``--dist loadfile``:
started last, one of them would keep one test process busy while the others are idle."""


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.split("::")[0] in SCALING_UNDER_LOAD:
            item.add_marker(pytest.mark.alone)
    rank = {module: i for i, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: modules stay whole


@pytest.hookimpl(optionalhook=True)  # (a hook of pytest-xdist: unknown without it)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` (``scripts/test``), but the ``SCALING_UNDER_LOAD`` modules are
    one unit of work: one test process runs them one after the other."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class OneScalingAtATime(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "scaling-under-load" if scope in SCALING_UNDER_LOAD else scope

    return OneScalingAtATime(config, log)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--allow-missing-system-tools",
        action="store_true",
        help="skip (not fail) the tests whose system tools (Prometheus) are not installed",
    )


@pytest.fixture(scope="session")
def postgres(request: pytest.FixtureRequest) -> Iterator[str]:
    """The DSN of a real PostgreSQL server of the session's own (``streamkit.sinks.local_postgres``)."""
    from streamkit.sinks.local_postgres import pg_bin, postgres_server

    bin_dir = pg_bin()
    if bin_dir is None:
        why = "PostgreSQL's server is not installed (apt-get install postgresql; .ci/run installs it)"
        if request.config.getoption("--allow-missing-system-tools"):
            pytest.skip(why)
        pytest.fail(f"{why}, or run with --allow-missing-system-tools", pytrace=False)
    with postgres_server(bin_dir) as dsn:
        yield dsn


@pytest.fixture
def system_tool(request: pytest.FixtureRequest) -> Callable[[str, str], str]:
    """``need(command, package) -> path``: a system tool a test runs (``.ci/run`` installs
    it from Debian's packages). Missing, the test fails with one line saying so, or is
    skipped with ``--allow-missing-system-tools``."""
    import shutil

    def need(command: str, package: str) -> str:
        found = shutil.which(command)
        if found is None:
            why = f"{command} is not installed (apt-get install {package}; .ci/run installs it)"
            if request.config.getoption("--allow-missing-system-tools"):
                pytest.skip(why)
            pytest.fail(f"{why}, or run with --allow-missing-system-tools", pytrace=False)
        return found

    return need


@pytest.fixture
def browser(system_tool: Callable[[str, str], str]) -> Iterator[Any]:
    """A headless Chromium driven by Selenium (missing: the suite's one-line failure, or a
    skip with --allow-missing-system-tools)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = system_tool("chromium", "chromium")
    chromedriver = system_tool("chromedriver", "chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--disable-extensions",
        "--disable-sync", "--no-first-run", "--window-size=1400,1800",
    ):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    try:
        yield driver
    finally:
        driver.quit()
