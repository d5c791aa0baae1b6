"""Operating a job: what a worker shows of itself to the tools that watch it.

``metrics``: Prometheus metrics, read from the worker at each scrape. The runtime hands
its counts over (``runtime.worker.Worker.metrics_view``); this package never imports the
runtime (an import contract).
"""
