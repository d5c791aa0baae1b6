"""The autoscaler's gauges as a Prometheus server serves them (``--metrics-port``): the
workers it wants stay at the last count decided, whatever the newest decision held at."""

from __future__ import annotations

import urllib.request

from streamkit.autoscale.gauges import serve_gauges
from streamkit.autoscale.policy import Decision
from tests.ports import listen_port


def test_the_gauges_serve_the_count_decided_and_the_figures_used() -> None:
    port = listen_port()
    held = Decision(0.0, "hold", 2, 2, "capacity matches the load", {"input/s": 10.0, "lag": 5.0, "busy": 0.5})
    stop = serve_gauges("orders", lambda: held, lambda: 4, port)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        stop()
    shown = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("streamkit_autoscale"))
    assert shown == {
        'streamkit_autoscale_desired_workers{app="orders"}': "4.0",
        'streamkit_autoscale_desired_processors{app="orders"}': "2.0",
        'streamkit_autoscale_input_records_per_second{app="orders"}': "10.0",
        'streamkit_autoscale_lag_records{app="orders"}': "5.0",
        'streamkit_autoscale_busy_ratio{app="orders"}': "0.5",
    }
