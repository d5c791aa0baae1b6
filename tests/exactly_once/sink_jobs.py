"""What the sink job tests (``sink_job_app``) share: a steady feed of numbered records,
and the rows a PostgreSQL table holds."""

from __future__ import annotations

import threading
import time

import psycopg

from streamkit.testing import produce_json


class Feed:
    """A thread writing records ``{"i": n}`` (n = 0, 1, ...) over 13 keys, 20 every 0.1 s
    (about 200 records/s), until :meth:`stop`; ``sent``: how many so far."""

    def __init__(self, broker: str, topic: str) -> None:
        self.broker, self.topic, self.sent = broker, topic, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._feed, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _feed(self) -> None:
        while not self._stop.is_set():
            produce_json(
                self.broker, self.topic, [(f"k{(self.sent + j) % 13}", {"i": self.sent + j}) for j in range(20)]
            )
            self.sent += 20
            time.sleep(0.1)


def pg_rows(dsn: str, table: str) -> tuple[int, int]:
    """The rows of ``table``, and its distinct ids."""
    with psycopg.connect(dsn) as conn:
        found = conn.execute(f"SELECT count(*), count(DISTINCT id) FROM {table}").fetchone()
        assert found is not None
        return int(found[0]), int(found[1])
