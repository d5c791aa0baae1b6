import time

PROCESS_START = time.time()  # first statement run by `python -m benchmarks.contenders.X`

"""Benchmark contenders, and the protocol between them and ``benchmarks.harness``.

A contender is a module ``benchmarks/contenders/<module>.py`` run by the harness, in its
own process, one contender at a time, all on the same input, as::

    python -m benchmarks.contenders.<module> --bootstrap B --topic T --records N \\
        --partitions P --workdir DIR --session-timeout-ms MS

with the current directory at the repository root. The harness names contenders by
short names; ``ALIASES`` maps a short name to its module (``faust`` -> ``faust_app``, so
that the module does not shadow the ``faust`` package); any other name is its module.

Input (prepared once by the harness, see ``benchmarks.input``): topic T with P
partitions holding exactly N records (a contender named in ``INPUTS`` reads a topic of
its own holding the same records, stamped) (a contender given a fraction of the work gets its
own smaller topic holding exactly its N records, so it always reads a whole topic).
Record i has key ``b"key-%d" % k`` (k = i % K, the key sequence shuffled
deterministically) and the orjson value ``{"amount": int, "seq": i}``; keys are placed
by Kafka's default partitioner; per key, seq increases with the offset.

The contender must:

1. take ``process_start = time.time()`` as the very first statement of the process.
   This package's first statement does it (``benchmarks.contenders.PROCESS_START``):
   ``python -m benchmarks.contenders.X`` imports it before X (``benchmarks/__init__.py``
   is empty). Use that value, or take your own as the first line of the module.
2. consume T from the beginning (a fresh consumer group, or plain assignment) and do
   its work on every record until it has processed N records; then stop by itself.
   ``--workdir`` is an empty directory for its state, removed by the harness afterwards.
   ``--session-timeout-ms`` is short (a first group join on Tansu waits half of it);
   keep heartbeats below a third of it.
3. print exactly one line to stdout, ``RESULT {json}``, and exit 0. Keys:

   records          int, records processed (must equal N)
   first_record_at  time.time() when the first record was processed
   last_record_at   time.time() when the last (N-th) record was processed
   process_start    time.time() at interpreter start (point 1)
   check            optional: {"keys": distinct keys seen, "count": records,
                    "sum": sum of all amounts}; the harness compares every field it
                    also knows with the expected values (same work done)
   error            optional: a one-line reason; the run is reported as failed
   anything else    kept in the JSON report (e.g. "contender", "stopped_at")

   Logs go to stderr (the harness keeps them in a file and shows the tail on failure).

The harness measures, per contender process: CPU seconds (user + sys, its children
included, from ``os.wait4``), peak RSS, wall time; and computes records/s first to last
record (steady) and from process start.

A contender whose module is missing, or whose ``REQUIRES`` (optional module-level tuple
of top-level package names, or the harness's own list for known peers) cannot be found,
is reported as skipped with the reason. A contender named in ``VENVS`` runs with the
python of a venv of its own (``.bench/venv-<name>``, made by the harness on first use
with the packages listed there), for a framework whose pins conflict with the project's;
its module may import only those packages, the standard library and this module.

Helpers for contenders: ``parse_args()`` parses the protocol's arguments (unknown ones
are ignored), ``emit_result(...)`` prints the RESULT line. A contender that runs a
framework which may hang (the peers) keeps its counts in ``new_progress()``, arms
``arm_watchdog(...)`` (after ``--timeout`` seconds it prints an error RESULT and exits
hard) and prints its own RESULT with ``emit_progress(...)``, which lets exactly one RESULT
out; ``run_peer(...)`` is the whole of such a contender's main around its run and its
read-back. This module imports only the standard library, lazily, so that it costs
nothing at start-up.
"""

from collections.abc import Callable, Iterable  # noqa: E402
from typing import Any  # noqa: E402

__all__ = [
    "PROCESS_START",
    "ALIASES",
    "INPUTS",
    "REQUIRES",
    "VENVS",
    "arm_watchdog",
    "check_totals",
    "emit_progress",
    "emit_result",
    "module_for",
    "new_progress",
    "parse_args",
    "run_peer",
]

# short name -> module under benchmarks.contenders
ALIASES: dict[str, str] = {
    "raw-dict": "raw",
    "raw-rocksdb": "raw",
    "raw-forked": "raw",
    "faust": "faust_app",
    "bytewax": "bytewax_app",
    "pathway": "pathway_app",
    "streamkit": "streamkit_app",
    "streamkit-stamped": "streamkit_app",
    "streamkit-nolog": "streamkit_app",
    "streamkit-nowrite": "streamkit_app",
    "streamkit-nostate": "streamkit_app",
    "streamkit-metrics": "streamkit_app",
    "streamkit-out": "streamkit_app",
    "streamkit-eos": "streamkit_app",
    "streamkit-eos-pg": "streamkit_app",
    "streamkit-eos-delta": "streamkit_app",
    "streamkit-merged": "streamkit_join_app",
    "streamkit-join": "streamkit_join_app",
    "streamkit-sjoin": "streamkit_join_app",
    "streamkit-tumbling": "streamkit_windows_app",
    "streamkit-hopping": "streamkit_windows_app",
    "streamkit-session": "streamkit_windows_app",
    "streamkit-count": "streamkit_windows_app",
    "streamkit-sliding": "streamkit_windows_app",
    "quix-hopping": "quix_hopping",
}
"""A contender process finds its short name in ``BENCH_CONTENDER`` (``raw-dict``: the raw
client keeping each key's count and sum in a dict, ``benchmarks.contenders.raw``;
``raw-rocksdb``: the same, persisting the changed keys by hand to RocksDB and a changelog
every 2 s, ``benchmarks.contenders.raw.Persisted``; ``raw-forked``: the same checkpoint in
a child process forked for each, ``benchmarks.contenders.raw.Forked``;
``streamkit-nolog``: streamkit with its changelog off; ``streamkit-nowrite``: streamkit with
its stores' writes left out, an upper bound, not a job
(``streamkit_app.leave_stores_unwritten``); ``streamkit-nostate``: with its checkpoints
writing none of the state down, another upper bound (``streamkit_app.leave_state_out``);
``streamkit-metrics``: with its Prometheus metrics served and scraped every second;
``streamkit-out``: sending each key's new count and sum to an output topic, at least
once, ``streamkit-eos`` the same exactly once, and
``streamkit-eos-pg`` and ``streamkit-eos-delta`` writing them to a PostgreSQL table
(``BENCH_PG_DSN``) or a Delta table as well; ``streamkit-merged``, ``streamkit-join`` and
``streamkit-sjoin``: with a second input topic, a table fed by it or a stream join with it,
``benchmarks.contenders.streamkit_join_app``; ``streamkit-hopping`` and the other kinds: a
windowed table of that kind instead of the plain one,
``benchmarks.contenders.streamkit_windows_app``)."""

# short name -> the input it reads, when not the plain one: "stamped" is the same records
# each carrying the stamp streamkit's producer writes (benchmarks.input)
INPUTS: dict[str, str] = {"streamkit-stamped": "stamped"}

# short name -> top-level packages a contender needs (checked before running it)
REQUIRES: dict[str, tuple[str, ...]] = {
    "raw": ("aiokafka", "orjson"),
    "raw-dict": ("aiokafka", "orjson"),
    "raw-rocksdb": ("aiokafka", "orjson", "rocksdict"),
    "raw-forked": ("aiokafka", "orjson", "rocksdict"),
    "streamkit": ("streamkit", "stores", "rocksdict"),
    "streamkit-stamped": ("streamkit", "stores", "rocksdict"),
    "streamkit-metrics": ("streamkit", "stores", "rocksdict"),
    "streamkit-out": ("streamkit", "stores", "rocksdict"),
    "streamkit-eos": ("streamkit", "stores", "rocksdict"),
    "streamkit-eos-pg": ("streamkit", "stores", "rocksdict", "psycopg"),
    "streamkit-eos-delta": ("streamkit", "stores", "rocksdict", "deltalake"),
    "streamkit-merged": ("streamkit", "stores", "rocksdict"),
    "streamkit-join": ("streamkit", "stores", "rocksdict"),
    "streamkit-sjoin": ("streamkit", "stores", "rocksdict"),
    "quix": ("quixstreams",),
    "quix-hopping": ("quixstreams",),
    **{
        f"streamkit-{kind}": ("streamkit", "stores", "rocksdict")
        for kind in ("tumbling", "hopping", "session", "count")
    },
    "faust": ("faust", "rocksdict"),
    "bytewax": ("bytewax", "confluent_kafka", "orjson"),
}

# short name -> the pip requirements of the venv of its own it runs in (see above)
VENVS: dict[str, tuple[str, ...]] = {"pathway": ("pathway==0.33.0", "orjson>=3.10")}


def module_for(name: str) -> str:
    """Short contender name -> module name under ``benchmarks.contenders`` (``NAME@DIR``:
    NAME's, run from another checkout, see :func:`checkout_of`)."""
    base = name.partition("@")[0]
    return ALIASES.get(base, base)


def checkout_of(name: str) -> str | None:
    """The checkout a contender named ``NAME@DIR`` runs from (the code before a change, to
    compare with this one in the same run), else None."""
    return name.partition("@")[2] or None


def parse_args(argv: list[str] | None = None, prog: str | None = None):
    """The protocol's arguments as an ``argparse.Namespace`` (bootstrap, topic, records,
    partitions, workdir, session_timeout_ms), plus ``timeout``: the hard timeout in seconds
    for ``arm_watchdog`` (``--timeout``; default ``$PEER_TIMEOUT_S``, which the harness
    sets, else 60 s + 1 ms per record). Unknown arguments are ignored."""
    import argparse
    import os

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="hard timeout in seconds (RESULT with an error, then exit); default "
        "$PEER_TIMEOUT_S, else 60 s + 1 ms per record",
    )
    args, _unknown = parser.parse_known_args(argv)
    if args.timeout is None:
        env = os.environ.get("PEER_TIMEOUT_S")
        args.timeout = float(env) if env else 60.0 + args.records / 1000.0
    return args


def emit_result(
    *,
    records: int,
    first_record_at: float | None,
    last_record_at: float | None,
    process_start: float,
    check: dict[str, Any] | None = None,
    error: str | None = None,
    **extra: Any,
) -> None:
    """Print the one ``RESULT {json}`` line and flush stdout."""
    import json
    import sys

    result: dict[str, Any] = {
        "records": records,
        "first_record_at": first_record_at,
        "last_record_at": last_record_at,
        "process_start": process_start,
    }
    if check is not None:
        result["check"] = check
    if error:
        result["error"] = error
    result.update(extra)
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


def check_totals(pairs: Iterable[tuple[int, int]]) -> dict[str, int]:
    """The RESULT's ``check`` from one ``(count, sum)`` pair per distinct key (read back
    from a contender's state)."""
    keys = count = total = 0
    for c, s in pairs:
        keys += 1
        count += c
        total += s
    return {"keys": keys, "count": count, "sum": total}


def new_progress() -> dict[str, Any]:
    """A contender's progress, shared with its watchdog: ``n`` records processed, ``first``
    and ``last`` record times, and ``done``, the lock that lets exactly one RESULT out."""
    import threading

    return {"n": 0, "first": None, "last": None, "done": threading.Lock()}


def emit_progress(progress: dict[str, Any], **extra: Any) -> bool:
    """Print the RESULT line of ``progress`` (records, first/last record times, process
    start, then ``extra``: check, error, ...) unless one was printed already (by the
    watchdog); True if this call printed it."""
    if not progress["done"].acquire(blocking=False):
        return False
    _emit_progress(progress, **extra)
    return True


def _emit_progress(progress: dict[str, Any], **extra: Any) -> None:
    emit_result(
        records=progress["n"],
        first_record_at=progress["first"],
        last_record_at=progress["last"],
        process_start=PROCESS_START,
        **extra,
    )


def arm_watchdog(timeout_s: float, progress: dict[str, Any], **extra: Any) -> None:
    """A stuck contender must not hang the harness: after ``timeout_s`` seconds print an
    error RESULT of ``progress`` (with ``extra``, e.g. ``contender=...``) and exit hard
    (code 3), unless the real RESULT is being printed."""
    import os
    import threading

    def fire() -> None:
        if not progress["done"].acquire(blocking=False):
            return  # the real RESULT is being printed
        error = f"timeout after {timeout_s:.0f}s with {progress['n']} records processed"
        _emit_progress(progress, error=error, **extra)
        os._exit(3)

    timer = threading.Timer(timeout_s, fire)
    timer.daemon = True
    timer.start()


def run_peer(
    args: Any,
    contender: str,
    run: Callable[[dict[str, Any]], Any],
    read_back: Callable[[], dict[str, Any]],
    *,
    stopper: str = "app",
) -> int:
    """A peer contender's main, given its ``parse_args()``: arm the watchdog, call
    ``run(progress)`` (the framework, which counts in ``progress`` and stops itself after
    ``args.records`` records), read the check back with ``read_back()`` and print the
    RESULT (with ``contender`` and ``stopped_at``).

    The error reported is the first of: an exception from ``run`` (its traceback goes to
    stderr), one from ``read_back``, ``progress["error"]`` (left by the run), an early stop
    ("<stopper> stopped after n of N records"). Returns the exit code: 0, 1 with an error,
    3 if the watchdog has printed the RESULT.
    """
    import time

    progress = new_progress()
    arm_watchdog(args.timeout, progress, contender=contender)
    error = None
    try:
        run(progress)
    except BaseException as exc:  # report, do not hang
        import traceback

        traceback.print_exc()
        error = f"{type(exc).__name__}: {exc}"

    stopped_at = time.time()
    check = None
    try:
        check = read_back()
    except Exception as exc:
        error = error or f"read-back failed: {type(exc).__name__}: {exc}"
    error = error or progress.get("error")
    if progress["n"] < args.records and error is None:
        error = f"{stopper} stopped after {progress['n']} of {args.records} records"
    if not emit_progress(progress, check=check, error=error, contender=contender, stopped_at=stopped_at):
        return 3  # the watchdog has fired and printed the RESULT
    return 0 if error is None else 1
