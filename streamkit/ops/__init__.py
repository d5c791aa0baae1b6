"""Operating a job: what a worker shows of itself to the tools that watch it.

``metrics``: Prometheus metrics, read from the worker at each scrape; ``queries``: the
HTTP side of queries of state by key; ``exposure``: what a worker's settings let it serve,
and to whom. The runtime hands its counts and its answers over
(``runtime.worker.Worker.metrics_view``, ``runtime.queries.QueryAnswers``); this package
never imports the runtime (an import contract).
"""
