"""The autoscaler's decisions as Prometheus gauges, served when asked (``--metrics-port``):
``streamkit_autoscale_desired_workers`` is what a Kubernetes HorizontalPodAutoscaler or
KEDA acts on with ``--workers gauge``; the others show what the decision used."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from streamkit.autoscale.policy import Decision
from streamkit.ops.metrics import serve_collector

__all__ = ["serve_gauges"]

_FIGURES = {
    "input/s": ("streamkit_autoscale_input_records_per_second", "Records/s written to the job's input topics."),
    "applied/s": ("streamkit_autoscale_applied_records_per_second", "Records/s the job applied."),
    "lag": ("streamkit_autoscale_lag_records", "Records written to the input and not applied yet."),
    "busy": ("streamkit_autoscale_busy_ratio", "Share of the workers' wall time spent in handlers."),
    "checkpointing": ("streamkit_autoscale_checkpointing_ratio", "Share of the workers' wall time checkpointing."),
    "workers needed": ("streamkit_autoscale_needed_workers", "Workers the load needs (before min and max)."),
}


class _DecisionCollector(Collector):
    def __init__(self, app: str, last: Callable[[], Decision | None], desired: Callable[[], int | None]) -> None:
        self.app, self.last, self.desired = app, last, desired

    def collect(self) -> Iterator[GaugeMetricFamily]:
        d = self.last()
        if d is None:
            return
        for name, value, text in (
            ("streamkit_autoscale_desired_workers", self.desired() or d.workers, "Workers the autoscaler wants."),
            ("streamkit_autoscale_desired_processors", d.processors, "Processors the autoscaler wants."),
        ):
            g = GaugeMetricFamily(name, text, labels=["app"])
            g.add_metric([self.app], float(value))
            yield g
        for key, (name, text) in _FIGURES.items():
            if key in d.figures:
                g = GaugeMetricFamily(name, text, labels=["app"])
                g.add_metric([self.app], float(d.figures[key]))
                yield g


def serve_gauges(
    app: str,
    last: Callable[[], Decision | None],
    desired: Callable[[], int | None],
    port: int,
    host: str = "127.0.0.1",
) -> Callable[[], None]:
    """Serve the gauges of ``last()`` (the newest decision) and ``desired()`` (the workers
    the last scale decided: it stays through the holds that follow) on ``host:port`` (this
    machine only unless told otherwise); returns what stops the server."""
    return serve_collector(_DecisionCollector(app, last, desired), port, host)
