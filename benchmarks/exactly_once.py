"""What exactly-once output costs: one job counting and summing per key that sends each
key's new figures to an output topic, at least once against exactly once, and exactly
once with each row also written to a PostgreSQL table or a Delta table (sinks).

    python -m benchmarks.exactly_once [--records 200000] [--keys 10000] [--repeat 5]
        [--contenders streamkit-out,streamkit-eos,streamkit-eos-pg,streamkit-eos-delta]

Runs ``benchmarks.harness`` with those contenders, interleaved ``--repeat`` times on one
broker and one input, and a PostgreSQL server of its own (``streamkit.sinks.local_postgres``;
the machine's PostgreSQL binaries, Debian's ``postgresql`` package): records/s per
contender, medians, and the ratios of the medians. The sink contenders' records/s are the
rows handed to the sink per second (an upsert writes a key's last row of a checkpoint).
"""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks import harness

CONTENDERS = "streamkit-out,streamkit-eos,streamkit-eos-pg,streamkit-eos-delta"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.exactly_once", description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--keys", default="10000")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--contenders", default=CONTENDERS)
    args, rest = ap.parse_known_args(argv)
    forwarded = ["--records", str(args.records), "--keys", args.keys, "--repeat", str(args.repeat),
                 "--contenders", args.contenders, *rest]  # fmt: skip
    if "streamkit-eos-pg" not in args.contenders:
        return harness.main(forwarded)
    from streamkit.sinks.local_postgres import pg_bin, postgres_server

    bin_dir = pg_bin()
    if bin_dir is None:
        print(
            "PostgreSQL's server is not installed (apt-get install postgresql): drop streamkit-eos-pg", file=sys.stderr
        )
        return 2
    with postgres_server(bin_dir) as dsn:
        os.environ["BENCH_PG_DSN"] = dsn
        return harness.main(forwarded)


if __name__ == "__main__":
    sys.exit(main())
