"""`streamkit reset MODULE:APP [--cluster]`: start a job over, like Kafka Streams'
application reset tool.

Without ``--cluster``: discard this machine's stores of the app (what a worker refuses
to start on after the cluster changed under them). With ``--cluster``: also forget the
job in the cluster (its record, hence its processor counts and incarnation, and its
progress), so that its next start reads its input topics from the beginning. Run it with
every worker of the app stopped, and without ``--cluster`` on every other machine too.
"""

from __future__ import annotations

import asyncio
import shutil

import typer

from streamkit.connection import Connection
from streamkit.loader import load_app


def reset(
    app_spec: str = typer.Argument(..., metavar="MODULE:APP"),
    cluster: bool = typer.Option(False, "--cluster", help="also forget the job's record and progress in the cluster"),
    broker: str | None = typer.Option(
        None, "--broker", "-b", help="with --cluster: bootstrap address (else the app's or STREAMKIT_BROKER)"
    ),
) -> None:
    """Discard the app's local stores (and, with --cluster, its records in the cluster)."""
    from stores.base import StoreLockedError
    from stores.rocksdb import LOCK_FILE
    from streamkit.cli import CliError
    from streamkit.spark.staging import lock_store

    app = load_app(app_spec)
    app_dir = app.store_path(0).parent.absolute()
    bootstrap = app.connection(broker)
    if cluster and bootstrap is None:
        raise CliError("no broker: give --broker or set STREAMKIT_BROKER (--cluster resets the job there)")
    held = ("processor-*", "global-*")  # processors' stores, and global tables' copies
    stores = sorted(p for g in held for p in app_dir.glob(g) if p.is_dir()) if app_dir.is_dir() else []
    locks = []
    try:
        for path in stores:
            if (path / LOCK_FILE).exists():
                try:
                    locks.append(lock_store(path))
                except StoreLockedError as exc:
                    raise CliError(
                        f"store {exc.path} is held by a running worker (pid {exc.pid}): stop it first"
                    ) from None
        if app_dir.is_dir():
            shutil.rmtree(app_dir)
    finally:
        for lock in locks:
            lock.release()
    typer.echo(f"{app.name}: {len(stores)} local store(s) under {app_dir} discarded")
    if cluster:
        assert bootstrap is not None
        forgot, offsets = asyncio.run(_forget(bootstrap, app.name, app.group_id, app.input_topics))
        typer.echo(
            f"{app.name}: job record {'removed' if forgot else 'absent'}, progress of group {app.group_id} "
            f"forgotten: the next start is a first start, from the beginning of {', '.join(app.input_topics)}"
        )
        if offsets:
            typer.echo(f"{app.name}: {offsets}", err=True)


async def _forget(bootstrap: Connection, app_name: str, group: str, topics: list[str]) -> tuple[bool, str]:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.structs import OffsetAndMetadata

    from streamkit.connection import as_connection
    from streamkit.kafkaio import KafkaIO
    from streamkit.runtime.jobmeta import forget_job
    from streamkit.runtime.progress import PROGRESS_TOPIC, forget_progress

    async with KafkaIO(bootstrap) as io:
        forgot = await forget_job(io, app_name)
        if await io.partition_count(PROGRESS_TOPIC) is not None:
            await forget_progress(io, group)
        counts = {t: await io.partition_count(t) or 0 for t in topics}
    # the group's Kafka offsets (what tools read; streamkit reads its progress log) back to
    # 0, committed from outside the group; a broker may refuse that (the test broker does)
    consumer = AIOKafkaConsumer(**as_connection(bootstrap).client_kwargs(), group_id=group, enable_auto_commit=False)
    await consumer.start()
    note = ""
    try:
        tps = [TopicPartition(t, p) for t, n in counts.items() for p in range(n)]
        if tps:
            consumer.assign(tps)
            await consumer.commit({tp: OffsetAndMetadata(0, "") for tp in tps})
    except Exception as exc:  # noqa: BLE001 - said, and harmless: the first checkpoint overwrites them
        note = (
            f"the group's Kafka offsets were left as they were (the broker refused: {type(exc).__name__}); "
            "streamkit does not read them, and the first checkpoint overwrites them"
        )
    finally:
        await consumer.stop()
    return forgot, note


def register(cli: typer.Typer) -> None:
    cli.command("reset")(reset)
