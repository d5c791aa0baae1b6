"""raw contender: aiokafka ``getmany`` + orjson decode of every value, no other work.
``raw-dict`` (``BENCH_CONTENDER``): the same, and the job's state kept in a plain dict
(each key's count and sum of ``amount``, as streamkit's contender keeps them in its
table), nothing persisted: what any Python job that holds per-key state pays, before a
store, a changelog or a checkpoint. ``raw-rocksdb``: ``raw-dict`` keeping its state durable
by hand, as streamkit's contender keeps it (:class:`Persisted` says how, and what it leaves
out): every 2 s, each key changed since is serialised once into the record batches of a
changelog topic and into a RocksDB write batch; the check is read back from RocksDB. What a
job in this client pays for durable state with no framework around it. ``raw-forked``: the
same checkpoint done by a child process forked for each one (:class:`Forked`), the job's
own thread going on meanwhile: what moving the checkpoint off that thread could win.

    python -m benchmarks.contenders.raw --bootstrap B --topic T --records N \\
        --partitions P --workdir DIR --session-timeout-ms MS

The client's limit: how fast one Python process can pull the input through aiokafka
and decode it. No consumer group (the partitions are assigned directly, so there is no
join to wait for), no commits, no state. The only work besides decoding is what the
check needs: the sum of ``amount`` and the set of keys.

Fetch sizes: 4 MiB per partition (aiokafka's default is 1 MiB), 64 MiB per request:
fewer, larger fetches. On a loaded machine 1/4/8/16 MiB made no difference beyond the
noise (about 2.0-2.3 us CPU per record each); revisit on a quiet one. CRC checks stay
on (aiokafka's default).
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.contenders import PROCESS_START, check_totals, emit_result, parse_args

MAX_PARTITION_FETCH_BYTES = 4 << 20
FETCH_MAX_BYTES = 64 << 20
CHECKPOINT_S = 2.0
"""As streamkit's default ``commit_interval``."""


class Persisted:
    """``raw-rocksdb``'s checkpoint, written by hand with the libraries streamkit uses, in
    the order streamkit's takes: the keys changed since the last one, per input partition,
    each serialised once (orjson) into aiokafka record batches of that partition of a
    changelog topic and into one RocksDB write batch with each partition's next offset;
    the record batches sent and acknowledged, then the write batch written.

    Set up as streamkit's are: the changelog's producer with 512 KiB batches, linger 0 and
    ``acks=all``; RocksDB in raw mode with 2 MiB memtables and bloom filters, one store for
    every partition with four memtables for each (streamkit: a store per processor, four
    memtables in each); after each checkpoint what is alive is frozen out of the garbage
    collector's walks, as streamkit's worker does. Not done, which streamkit does: offsets
    committed to a group (the raw client has none) and a marker closing each checkpoint in
    the changelog."""

    def __init__(self, producer: Any, topic: str, path: Path, partitions: int) -> None:
        from rocksdict import BlockBasedOptions, Options, Rdict

        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_write_buffer_size(2 << 20)
        opts.set_max_write_buffer_number(4 * partitions)
        table = BlockBasedOptions()
        table.set_bloom_filter(10, False)
        opts.set_block_based_table_factory(table)
        self.path = path
        self.db = Rdict(str(path), opts)
        self.producer, self.topic = producer, topic
        self.changed: dict[int, dict[bytes, list[int]]] = {}
        """Per input partition, the keys changed since the last checkpoint and their state."""
        self.positions: dict[int, int] = {}
        """Per input partition, the offset of the next record to read."""
        self.due = time.monotonic() + CHECKPOINT_S

    async def checkpoint(self) -> None:
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        put = batch.put
        sent = await send_changed(self.producer, self.topic, self.changed, put)
        for partition, position in self.positions.items():
            put(POSITION_KEY + b"%d" % partition, b"%d" % position)
        for delivery in sent:
            await delivery
        self.db.write(batch)
        self.changed = {}
        gc.freeze()  # what is alive now out of the collector's later walks, as streamkit's worker does
        self.due = time.monotonic() + CHECKPOINT_S

    async def close(self, last_checkpoint: bool = True) -> None:
        """The last checkpoint (unless the run failed); the producer stopped, the store closed."""
        try:
            if last_checkpoint:
                await self.checkpoint()
        finally:
            await self.producer.stop()
            self.db.close()

    def stored(self) -> Iterator[tuple[int, int]]:
        """Every key's (count, sum) as RocksDB holds them, after :meth:`close`."""
        import orjson
        from rocksdict import Options, Rdict

        db = Rdict(str(self.path), Options(raw_mode=True))
        try:
            for key, value in db.items():
                if not key.startswith(POSITION_KEY):
                    count, total = orjson.loads(value)
                    yield count, total
        finally:
            db.close()


class Forked(Persisted):
    """``raw-forked``'s checkpoint: :class:`Persisted`'s, done by a child process forked
    at each checkpoint, so that the job's own thread does none of it. The child sees the
    changed keys as they were at the fork (copy on write), serialises each once into
    the changelog's record batches (sent through a producer of its own) and, in key
    order, into an SST file; when the changelog has acknowledged them it exits, and the
    job ingests the file into RocksDB (a move of the file: the memtables stay empty)
    before it forks the next checkpoint. The job's thread pays the fork, the pages it
    writes while a child shares them, and the ingestion."""

    def __init__(self, args: Any, topic: str, path: Path, partitions: int) -> None:
        super().__init__(None, topic, path, partitions)
        self.args = args
        self.child: tuple[int, int, str] | None = None
        """The checkpoint in flight: the child's pid, the read end of its pipe, its SST file."""
        self.count = 0

    async def checkpoint(self) -> None:
        await self.wait()
        changed, positions = self.changed, dict(self.positions)
        self.changed = {}
        self.count += 1
        sst = str(self.path.with_name(f"checkpoint-{self.count}.sst"))
        gc.freeze()  # the collector would otherwise write to every object the child shares
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                os.close(read_end)
                asyncio.events._set_running_loop(None)
                asyncio.run(self._write(changed, positions, sst))
                os.write(write_end, b"1")
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        self.child = (pid, read_end, sst)
        self.due = time.monotonic() + CHECKPOINT_S

    async def _write(self, changed: dict[int, dict[bytes, list[int]]], positions: dict[int, int], sst: str) -> None:
        from rocksdict import Options, SstFileWriter

        producer = changelog_producer(self.args.bootstrap)
        await producer.start()
        try:
            serialised: list[tuple[bytes, bytes]] = []

            def keep(key: bytes, value: bytes) -> None:
                serialised.append((key, memoryview(value).tobytes()))  # orjson's own pins 4 KiB

            sent = await send_changed(producer, self.topic, changed, keep)
            serialised += [(POSITION_KEY + b"%d" % q, b"%d" % at) for q, at in positions.items()]
            serialised.sort()
            writer = SstFileWriter(Options(raw_mode=True))
            writer.open(sst)
            for key, value in serialised:
                writer[key] = value
            writer.finish()
            for delivery in sent:
                await delivery
        finally:
            await producer.stop()

    async def wait(self) -> None:
        """The checkpoint in flight done: its child exited, its file ingested."""
        if self.child is None:
            return
        from rocksdict import IngestExternalFileOptions

        pid, read_end, sst = self.child
        self.child = None
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        loop.add_reader(read_end, lambda: done.done() or done.set_result(os.read(read_end, 1)))
        try:
            ok = await done
        finally:
            loop.remove_reader(read_end)
            os.close(read_end)
            _, status = os.waitpid(pid, 0)
        if ok != b"1" or os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"checkpoint {sst}: its child failed (exit status {status})")
        opts = IngestExternalFileOptions()
        opts.set_move_files(True)
        self.db.ingest_external_file([sst], opts)

    async def close(self, last_checkpoint: bool = True) -> None:
        try:
            if last_checkpoint:
                await self.checkpoint()
            await self.wait()
        finally:
            self.db.close()


POSITION_KEY = b"\x00position-"
"""Prefix of a partition's next offset in ``raw-rocksdb``'s store (no input key starts so)."""

CHANGELOG_BATCH_BYTES = 512 << 10
"""As streamkit's changelog producer's batches."""


def changelog_producer(bootstrap: str) -> Any:
    """A producer set up as streamkit's changelog producer: 512 KiB batches, linger 0,
    ``acks=all`` (not started)."""
    from aiokafka import AIOKafkaProducer

    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=0,
        max_batch_size=CHANGELOG_BATCH_BYTES,
        max_request_size=2 * CHANGELOG_BATCH_BYTES,
    )


async def send_changed(producer: Any, topic: str, changed: dict[int, dict[bytes, list[int]]], keep: Any) -> list[Any]:
    """Each changed key's value serialised once (orjson), handed to ``keep(key, value)``
    and appended to record batches of its partition of ``topic``, each sent when full;
    the deliveries of those batches."""
    import orjson

    dumps, sent = orjson.dumps, []
    for partition, keys in changed.items():
        records = producer.create_batch()
        for key, current in keys.items():
            value = dumps(current)
            keep(key, value)
            if records.append(key=key, value=value, timestamp=None) is None:
                sent.append(await producer.send_batch(records, topic, partition=partition))
                records = producer.create_batch()
                records.append(key=key, value=value, timestamp=None)
        if records.record_count():
            sent.append(await producer.send_batch(records, topic, partition=partition))
    return sent


async def create_changelog(args: Any) -> str:
    """A changelog topic of this run's own (a partition per input partition), created."""
    import uuid

    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic = f"{args.topic}-changelog-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=args.bootstrap)
    await admin.start()
    try:
        answer = await admin.create_topics([NewTopic(topic, args.partitions, 1)])
    finally:
        await admin.close()
    errors = [(name, code) for name, code, *_ in answer.topic_errors if code]
    if errors:
        raise RuntimeError(f"creating the changelog topic {topic}: error codes {errors}")
    return topic


async def start_persisted(args: Any) -> Persisted:
    """A :class:`Persisted` writing to a changelog topic of its own, through a producer of
    its own, started."""
    topic = await create_changelog(args)
    producer = changelog_producer(args.bootstrap)
    await producer.start()
    return Persisted(producer, topic, Path(args.workdir) / "state", args.partitions)


async def start_forked(args: Any) -> Forked:
    """A :class:`Forked` writing to a changelog topic of its own, created here."""
    return Forked(args, await create_changelog(args), Path(args.workdir) / "state", args.partitions)


async def run(args) -> dict:
    import orjson
    from aiokafka import AIOKafkaConsumer, TopicPartition

    loads = orjson.loads
    consumer = AIOKafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES,
        fetch_max_bytes=FETCH_MAX_BYTES,
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    mode = os.environ.get("BENCH_CONTENDER") or "raw"
    persisted: Persisted | None = None
    try:
        tps = [TopicPartition(args.topic, p) for p in range(args.partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        target = args.records
        n = 0
        total = 0
        keys: set[bytes] = set()
        state: dict[bytes, list[int]] | None = {} if mode in ("raw-dict", "raw-rocksdb", "raw-forked") else None
        if mode == "raw-rocksdb":
            persisted = await start_persisted(args)
        elif mode == "raw-forked":
            persisted = await start_forked(args)
        first = last = None
        while n < target:
            batches = await consumer.getmany(timeout_ms=1000)
            for msgs in batches.values():
                if not msgs:
                    continue
                if first is None:
                    first = time.time()
                if n + len(msgs) > target:
                    msgs = msgs[: target - n]
                if state is None:
                    for m in msgs:
                        total += loads(m.value)["amount"]
                        keys.add(m.key)
                elif persisted is not None:
                    changed = persisted.changed.setdefault(msgs[0].partition, {})
                    for m in msgs:
                        amount = loads(m.value)["amount"]
                        total += amount
                        s = state.get(m.key)
                        state[m.key] = changed[m.key] = [1, amount] if s is None else [s[0] + 1, s[1] + amount]
                    persisted.positions[msgs[0].partition] = msgs[-1].offset + 1
                    if time.monotonic() >= persisted.due:
                        await persisted.checkpoint()
                else:
                    for m in msgs:
                        amount = loads(m.value)["amount"]
                        total += amount
                        s = state.get(m.key)
                        state[m.key] = [1, amount] if s is None else [s[0] + 1, s[1] + amount]
                n += len(msgs)
                if n >= target:
                    break
        last = time.time()
        check = {"keys": len(keys) if state is None else len(state), "count": n, "sum": total}
        if persisted is not None:
            done, persisted = persisted, None
            await done.close()
            check = check_totals(done.stored())
        return {"records": n, "first_record_at": first, "last_record_at": last, "check": check}
    finally:
        if persisted is not None:  # the run failed
            await persisted.close(last_checkpoint=False)
        await consumer.stop()


def main() -> int:
    args = parse_args(prog="benchmarks.contenders.raw")
    try:
        result = asyncio.run(run(args))
    except Exception as exc:  # report, do not hang the harness
        emit_result(
            records=0,
            first_record_at=None,
            last_record_at=None,
            process_start=PROCESS_START,
            error=f"{type(exc).__name__}: {exc}",
            contender="raw",
        )
        return 1
    emit_result(process_start=PROCESS_START, contender="raw", **result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
