"""`streamkit consume TOPIC`: a topic's records for a person or a script; dead letters with
their reason and error; streamkit's own records (copies for compaction, forwarded strays,
changelog markers) labelled or counted, never dropped silently; --follow tails."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import orjson
from aiokafka import AIOKafkaProducer

from assignors.murmur2 import key_hash
from stores.base import Checkpoint
from stores.serde import StrSerde
from streamkit.delivery import split_from
from streamkit.kafkaio import KafkaIO
from streamkit.producer import Producer
from streamkit.runtime.output import Output
from streamkit.state.changelog import ChangelogWriter
from streamkit.testing import aread_topic, create_topic, produce_json, unique_topic_name

ROOT = Path(__file__).resolve().parents[2]
WHEN = 1714564800123  # 2024-05-01T12:00:00.123Z


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "streamkit.cli", *args]


def _env(broker: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")}
    return {**env, "PYTHONPATH": str(ROOT), "STREAMKIT_BROKER": broker}


def streamkit(broker: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The real command, as a user runs it (the broker from STREAMKIT_BROKER)."""
    return subprocess.run(_command(*args), env=_env(broker), cwd=ROOT, capture_output=True, text=True, timeout=90)


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def blocks(stdout: str) -> list[list[str]]:
    """The text output, one list of lines per record (a record starts at "partition ")."""
    out: list[list[str]] = []
    for line in stdout.splitlines():
        if line.startswith("partition "):
            out.append([line])
        else:
            out[-1].append(line)
    return out


def _mixed_topic(broker: str) -> str:
    """Two partitions: a JSON value, a text value, a binary value without a key, a tombstone,
    and a record with a header of its own."""
    topic = create_topic(broker, unique_topic_name("consume"), 2)
    produce_json(
        broker,
        topic,
        [
            ("k1", {"n": 1}, 0, WHEN),
            ("k2", b"plain text\nline two", 0, WHEN + 1),
            (None, b"\x00\x01\xff", 1, WHEN + 2),
            ("k3", None, 1, WHEN + 3),
        ],
    )
    produce_json(broker, topic, [("k4", [1, 2], 0, WHEN + 4)], headers=[("trace", b"abc")])
    return topic


def test_consume_prints_every_record_to_the_end_then_exits(broker: str) -> None:
    topic = _mixed_topic(broker)
    proc = streamkit(broker, "consume", topic)
    assert proc.returncode == 0, proc.stderr
    shown = blocks(proc.stdout)
    # each partition in offset order; the partitions' turns follow the fetch answers (one
    # may end at a batch boundary under load: the partition's rest comes in its next turn)
    where = [tuple(b[0].split()[1:4:2]) for b in shown]
    assert sorted(where) == [("0", "0"), ("0", "1"), ("0", "2"), ("1", "0"), ("1", "1")]
    for part in ("0", "1"):
        assert [o for p, o in where if p == part] == sorted((o for p, o in where if p == part), key=int)
    by_offset = {(b[0].split()[1], b[0].split()[3]): b for b in shown}
    assert by_offset["0", "0"] == [
        "partition 0  offset 0  2024-05-01T12:00:00.123Z  key: k1",
        '  value: {"n":1}',
    ]
    assert by_offset["0", "1"][1] == "  value: (text) plain text\\nline two"
    assert by_offset["0", "2"] == [
        "partition 0  offset 2  2024-05-01T12:00:00.127Z  key: k4",
        "  value: [1,2]",
        "  headers: trace=abc",
    ]
    assert by_offset["1", "0"] == [
        "partition 1  offset 0  2024-05-01T12:00:00.125Z  key: (none)",
        "  value: (binary, 3 bytes, base64) AAH/",
    ]
    assert by_offset["1", "1"][1] == "  value: none (no value: a tombstone)"
    assert proc.stderr.splitlines()[-1] == f"{topic}: 5 records (by partition 0: 3, 1: 2)"

    one = streamkit(broker, "consume", topic, "--partition", "1", "--max", "1")
    assert one.returncode == 0, one.stderr
    assert [b[0] for b in blocks(one.stdout)] == ["partition 1  offset 0  2024-05-01T12:00:00.125Z  key: (none)"]
    assert one.stderr.splitlines()[-1] == f"{topic}: 1 record (by partition 1: 1); stopped at --max 1"

    assert "topic nowhere-to-be-found does not exist" in error_line(streamkit(broker, "consume", "nowhere-to-be-found"))
    assert "no partition 7" in error_line(streamkit(broker, "consume", topic, "-p", "7"))
    assert "--from-end needs --follow" in error_line(streamkit(broker, "consume", topic, "--from-end"))


def test_consume_json_is_one_object_per_line(broker: str) -> None:
    topic = _mixed_topic(broker)
    proc = streamkit(broker, "consume", topic, "--json")
    assert proc.returncode == 0, proc.stderr
    records = {(r["partition"], r["offset"]): r for r in map(orjson.loads, proc.stdout.splitlines())}
    assert records[0, 0] == {
        "topic": topic,
        "partition": 0,
        "offset": 0,
        "timestamp": WHEN,
        "key": "k1",
        "value": {"n": 1},
        "value_format": "json",
        "headers": [],
    }
    assert (records[0, 1]["value"], records[0, 1]["value_format"]) == ("plain text\nline two", "text")
    assert (records[0, 2]["value"], records[0, 2]["headers"]) == ([1, 2], [["trace", "abc"]])
    assert (records[1, 0]["key"], records[1, 0]["value"], records[1, 0]["value_format"]) == (None, "AAH/", "base64")
    assert (records[1, 1]["value"], records[1, 1]["value_format"]) == (None, None)
    assert len(records) == 5


async def _dead_letters_and_a_forwarded_stray(broker: str, source: str, dead_letters: str) -> None:
    """What a worker writes for a record it cannot handle, and for a stray, through the
    worker's own Output and producer."""
    [record] = await aread_topic(broker, source)
    async with Producer(broker, client_id="test-consume-dead-letters") as producer:
        output = Output("shop", dead_letters, {}, producer)
        try:
            StrSerde().dumps(record.key)  # the key is None: what a keyed app fails on
        except TypeError as exc:
            await output.dead_letter(record, "handler", exc, "count_orders")
        await output.stray(record, "dead-letter")
        await output.stray(record, "forward")
        await output.flush()


def test_dead_letters_show_their_reason_error_and_origin(broker: str) -> None:
    source = create_topic(broker, unique_topic_name("orders"), 1)
    dead_letters = create_topic(broker, unique_topic_name("shop-dead-letters"), 1)
    produce_json(broker, source, [(None, {"amount": 3}, 0, WHEN)])
    asyncio.run(_dead_letters_and_a_forwarded_stray(broker, source, dead_letters))

    proc = streamkit(broker, "consume", dead_letters)
    assert proc.returncode == 0, proc.stderr
    handler, misplaced = blocks(proc.stdout)
    assert handler[1:] == [
        "  DEAD LETTER  reason: handler",
        "  error: TypeError: StrSerde needs str, got NoneType: None",
        f"  from: {source} partition 0 offset 0 (handler count_orders)",
        '  value: {"amount":3}',
    ]
    assert misplaced[1] == "  DEAD LETTER  reason: misplaced"
    assert misplaced[2].startswith(f"  error: {source}[0] offset 0: the topic's layout does not place this record")
    assert proc.stderr.splitlines()[-1].endswith("dead letters by reason: handler 1, misplaced 1"), proc.stderr

    as_json = streamkit(broker, "consume", dead_letters, "--json", "--max", "1")
    assert orjson.loads(as_json.stdout)["dead_letter"] == {
        "reason": "handler",
        "error": "TypeError: StrSerde needs str, got NoneType: None",
        "handler": "count_orders",
        "source": {"topic": source, "partition": 0, "offset": 0},
    }

    forwarded = blocks(streamkit(broker, "consume", source).stdout)[1]
    assert forwarded[1].startswith("  FORWARDED STRAY: the record at partition 0 offset 0, placed again"), forwarded


async def _changelog_batch(broker: str, topic: str) -> None:
    async with KafkaIO(broker) as io:
        producer = AIOKafkaProducer(bootstrap_servers=broker, enable_idempotence=False)
        await producer.start()
        try:
            writer = ChangelogWriter(producer, io, topic)
            await writer.write(0, [(b"counts\x00k1", b"7")], Checkpoint.empty(), base=None)
        finally:
            await producer.stop()


def test_streamkits_own_records_are_labelled_or_counted(broker: str, tmp_path: Path) -> None:
    topic = unique_topic_name("compacted")
    made = streamkit(broker, "topics", "create", topic, "--partitions", "2", "--capacity", "4", "--compacted")
    assert made.returncode == 0, made.stderr
    grown = streamkit(broker, "topics", "expand", topic, "--partitions", "3")
    assert grown.returncode == 0, grown.stderr
    keys = [f"customer-{i}" for i in range(30)]
    copies = sum(len(split_from(key_hash(k.encode()), 2, 3)) for k in keys)
    assert copies > 0  # keys of partition 0 moved to 2: their records are copied to 0 as well
    lines = tmp_path / "orders.jsonl"
    lines.write_text("".join(orjson.dumps({"customer": k}).decode() + "\n" for k in keys))
    sent = streamkit(broker, "produce", topic, str(lines), "--key-field", "customer", "--no-progress")
    assert sent.returncode == 0, sent.stderr

    proc = streamkit(broker, "consume", topic)
    assert proc.returncode == 0, proc.stderr
    assert len(blocks(proc.stdout)) == len(keys)
    assert f"{copies} streamkit copies for compaction skipped (--show-copies shows them)" in proc.stderr

    shown = streamkit(broker, "consume", topic, "--show-copies", "--json")
    records = [orjson.loads(line) for line in shown.stdout.splitlines()]
    labelled = [r for r in records if r.get("streamkit") == "compaction-copy"]
    assert (len(records), len(labelled)) == (len(keys) + copies, copies)
    text = blocks(streamkit(broker, "consume", topic, "--show-copies").stdout)
    assert sum(1 for b in text if b[1].startswith("  COPY for compaction of the record placed in partition")) == copies

    changelog = unique_topic_name("shop-changelog")
    asyncio.run(_changelog_batch(broker, changelog))
    change, marker = blocks(streamkit(broker, "consume", changelog).stdout)
    assert "CHANGELOG MARKER" not in "\n".join(change)
    assert marker[1] == "  CHANGELOG MARKER: where a store's checkpoint ends in its changelog", marker


class Following:
    """A running `streamkit consume --follow`: its output lines awaited one by one, each
    with a deadline (a reader thread per stream hands them over as they come, then None
    at the stream's end)."""

    def __init__(self, broker: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            _command("consume", *args), env=_env(broker), cwd=ROOT, text=True, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        self.out: queue.Queue[str | None] = queue.Queue()
        self.err: queue.Queue[str | None] = queue.Queue()
        for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._pump, args=(stream, into), daemon=True).start()

    @staticmethod
    def _pump(stream: IO[str] | None, into: queue.Queue[str | None]) -> None:
        assert stream is not None
        for line in stream:
            into.put(line.rstrip("\n"))
        into.put(None)

    def next(self, lines: queue.Queue[str | None], timeout: float = 60.0) -> str | None:
        """The next line (None: the stream ended)."""
        try:
            return lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout} s (exit code {self.proc.poll()})") from None

    def records(self, n: int) -> list[dict[str, Any]]:
        return [orjson.loads(self.next(self.out) or "null") for _ in range(n)]

    def rest(self, lines: queue.Queue[str | None]) -> list[str]:
        """Every line up to the stream's end."""
        out: list[str] = []
        while (line := self.next(lines)) is not None:
            out.append(line)
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def test_follow_prints_new_records_until_interrupted(broker: str) -> None:
    topic = create_topic(broker, unique_topic_name("tail"), 2)
    produce_json(broker, topic, [("a", {"n": 1}, 0), ("b", {"n": 2}, 1)])
    following = Following(broker, topic, "--follow", "--json")
    try:
        assert following.next(following.err) == f"following {topic} (partitions [0, 1]) from the start; Ctrl-C to stop"
        assert sorted(r["key"] for r in following.records(2)) == ["a", "b"]
        produce_json(broker, topic, [("c", {"n": 3}, 1), ("d", {"n": 4}, 0)])
        assert sorted(r["key"] for r in following.records(2)) == ["c", "d"]
        following.proc.send_signal(signal.SIGINT)
        assert following.proc.wait(timeout=30) == 130
        assert following.rest(following.err)[-1] == f"{topic}: 4 records (by partition 0: 2, 1: 2); interrupted"
    finally:
        following.close()


def test_follow_from_the_end_shows_only_new_records_up_to_max(broker: str) -> None:
    topic = create_topic(broker, unique_topic_name("tail-end"), 1)
    produce_json(broker, topic, [(f"old-{i}", {"n": i}) for i in range(3)])
    following = Following(broker, topic, "-f", "--from-end", "--max", "2", "--json")
    try:
        assert (following.next(following.err) or "").endswith("from the end; Ctrl-C to stop")
        produce_json(broker, topic, [(f"new-{i}", {"n": i}) for i in range(3)])
        assert following.proc.wait(timeout=60) == 0  # --max ends it
        assert [r["key"] for r in following.records(2)] == ["new-0", "new-1"]
        assert following.rest(following.out) == []
        assert following.rest(following.err)[-1] == f"{topic}: 2 records (by partition 0: 2); stopped at --max 2"
    finally:
        following.close()
