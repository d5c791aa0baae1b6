"""The embedded broker, the testing helpers and the ``streamkit broker`` command."""

from __future__ import annotations

import asyncio
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import orjson
import psutil
import pytest
from aiokafka.errors import TopicAlreadyExistsError

from streamkit.broker import BrokerError, EmbeddedBroker, api_versions, resolve_broker
from streamkit.kafkaio import KafkaIO, KafkaIOError, reads
from streamkit.testing import default_partition

ROOT = Path(__file__).resolve().parents[1]
FETCH, PRODUCE = 1, 0


def gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether ``pid`` has exited (or is a zombie nobody reaped) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def refused(bootstrap: str) -> bool:
    host, port = bootstrap.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return True
    return False


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        raise TimeoutError("no output")
    return proc.stdout.readline()


# --------------------------------------------------------------------------- EmbeddedBroker


def test_embedded_broker_starts_answers_and_stops() -> None:
    broker = EmbeddedBroker()
    try:
        assert re.fullmatch(r"127\.0\.0\.1:\d+", broker.bootstrap)
        assert broker.running and psutil.pid_exists(broker.pid)
        versions = api_versions(broker.bootstrap)
        assert FETCH in versions and PRODUCE in versions
        assert broker.api_versions == versions
        assert broker.log_path is not None and broker.log_path.exists()
    finally:
        pid, bootstrap = broker.pid, broker.bootstrap
        broker.stop()
    assert gone(pid)
    assert refused(bootstrap)
    assert not broker.running and broker.pid is None
    broker.stop()  # idempotent


def test_second_broker_gets_another_port_and_both_answer() -> None:
    with EmbeddedBroker() as first, EmbeddedBroker() as second:
        assert first.port != second.port
        assert first.pid != second.pid
        api_versions(first.bootstrap)
        api_versions(second.bootstrap)


def test_a_taken_port_is_a_one_line_error(broker: str) -> None:
    port = int(broker.rsplit(":", 1)[1])
    with pytest.raises(BrokerError) as info:
        EmbeddedBroker(port=port)
    assert "address in use" in str(info.value)
    assert "\n" not in str(info.value)
    api_versions(broker)  # the suite's broker is untouched


def test_broker_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """Neither a clean exit without stop() (atexit) nor SIGKILL (PDEATHSIG) leaves a broker."""
    script = textwrap.dedent(
        """
        import os, sys, time
        from streamkit.broker import EmbeddedBroker
        b = EmbeddedBroker()
        print(b.pid, b.log_path.parent, flush=True)
        if sys.argv[1] == "exit":
            sys.exit(0)
        time.sleep(60)
        """
    )
    for mode in ("exit", "sigkill"):
        proc = subprocess.Popen([sys.executable, "-c", script, mode], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            pid_text, log_dir = read_line(proc, 20).split()
            broker_pid = int(pid_text)
            if mode == "sigkill":
                proc.kill()
            proc.wait(timeout=20)
            assert gone(broker_pid), f"broker survived its parent ({mode})"
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
        if mode == "sigkill":  # nobody was left to remove the log
            shutil.rmtree(log_dir, ignore_errors=True)
        else:
            assert not Path(log_dir).exists()  # a clean stop at exit removes it


def test_resolve_broker_uses_a_given_address_and_checks_it(broker: str) -> None:
    with resolve_broker(broker) as handle:
        assert handle.bootstrap == broker
        assert FETCH in handle.api_versions
    api_versions(broker)  # using an external broker never stops it


def test_resolve_broker_unreachable_is_a_one_line_error() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BrokerError) as info:
        resolve_broker(f"127.0.0.1:{port}", timeout=0.3)
    message = str(info.value)
    assert message == f"cannot reach broker 127.0.0.1:{port}: connection refused"


def test_resolve_broker_none_starts_an_embedded_one() -> None:
    with resolve_broker(None) as handle:
        assert isinstance(handle, EmbeddedBroker)
        api_versions(handle.bootstrap)
        pid = handle.pid
    assert gone(pid)


# --------------------------------------------------------------------------- helpers


def test_produce_and_read_round_trip(topic_factory, produce, read_all) -> None:
    topic = topic_factory(3)
    records = [(f"key-{i % 17}", {"amount": i % 10, "seq": i}) for i in range(5000)]
    assert produce(topic, records) == len(records)
    got = read_all(topic)
    assert len(got) == len(records)
    # every keyed record sits where Kafka's default partitioner puts it
    assert all(m.partition == default_partition(m.key, 3) for m in got)
    # per-key order is the order produced; nothing lost, nothing doubled
    seqs: dict[bytes, list[int]] = defaultdict(list)
    for m in got:
        seqs[m.key].append(orjson.loads(m.value)["seq"])
    for key, s in seqs.items():
        assert s == sorted(s), key
    assert sorted(x for s in seqs.values() for x in s) == list(range(len(records)))
    # offsets are dense per partition, from 0
    by_part: dict[int, list[int]] = defaultdict(list)
    for m in got:
        by_part[m.partition].append(m.offset)
    for offsets in by_part.values():
        assert offsets == list(range(len(offsets)))


def test_read_topic_ends_at_the_fetch_high_watermark(topic_factory, produce, read_all) -> None:
    """Many records in one batch per partition (where Tansu's ListOffsets is wrong)."""
    topic = topic_factory(2)
    produce(topic, [(None, {"i": i}, i % 2) for i in range(101)])
    got = read_all(topic)
    assert [m.offset for m in got if m.partition == 0] == list(range(51))
    assert [m.offset for m in got if m.partition == 1] == list(range(50))
    produce(topic, [(b"k", {"i": 101}, 1)])
    assert len(read_all(topic)) == 102
    assert len(read_all(topic, partitions=[1])) == 51


def test_a_read_of_records_that_never_come_names_them_once_its_fetches_time_is_up(
    broker: str, topic_factory, produce, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Empty answers are asked again with longer waits (a loaded broker often gathers
    nothing in a short one); records still missing after ``EMPTY_FETCH_SECONDS`` fail the
    read with the range that never came."""
    topic = topic_factory(1)
    produce(topic, [(b"k", {"i": i}, 0) for i in range(3)])
    monkeypatch.setattr(reads, "EMPTY_FETCH_SECONDS", 0.5)

    async def run() -> tuple[int, str]:
        async with KafkaIO(broker) as io:
            records, end = await io.read(topic, 0, 1)
            assert [r.offset for r in records] == [1, 2] and end == 3
            assert await io.read(topic, 0, 3) == ([], 3)
            with pytest.raises(KafkaIOError) as failed:
                await io.read(topic, 0, 0, end=5)
            return len(records), str(failed.value)

    _, message = asyncio.run(run())
    assert message == f"{topic}[0]: no records between offsets 3 and 5 in 0.5 s of fetches", message


def test_explicit_partitions_bytes_values_and_empty_topics(topic_factory, produce, read_all) -> None:
    empty = topic_factory(4)
    assert read_all(empty) == []
    topic = topic_factory(2)
    produce(topic, [(b"a", b"raw-bytes", 1), ("b", None, 0)])
    got = {m.partition: m for m in read_all(topic)}
    assert got[1].value == b"raw-bytes" and got[0].value is None and got[0].key == b"b"


def test_creating_an_existing_topic_fails(broker: str, topic_factory) -> None:
    from streamkit.testing import create_topic

    topic = topic_factory(1)
    with pytest.raises(TopicAlreadyExistsError):
        create_topic(broker, topic, 1)


# --------------------------------------------------------------------------- CLI


def test_cli_broker_prints_its_address_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamkit.cli", "broker"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        line = read_line(proc, 30)
        match = re.fullmatch(r"broker listening on (127\.0\.0\.1:\d+)\n", line)
        assert match, line
        bootstrap = match.group(1)
        assert FETCH in api_versions(bootstrap)
        tansu = [c.pid for c in psutil.Process(proc.pid).children()]
        assert len(tansu) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert gone(tansu[0])
        assert refused(bootstrap)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_cli_broker_error_is_one_line(broker: str) -> None:
    port = broker.rsplit(":", 1)[1]
    result = subprocess.run(
        [sys.executable, "-m", "streamkit.cli", "broker", "--port", port],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, "STREAMKIT_DEBUG": ""},
    )
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert result.stderr.startswith("error: ") and "address in use" in result.stderr
