"""Autoscaling: a job's workers and processors follow its load (``streamkit autoscale``).

``policy`` decides from samples (pure); ``signals`` samples what the job publishes;
``controller`` looks, decides and acts; ``local_workers`` and ``gauges`` are its levers
for workers (processes on this machine, or a gauge for a cluster's autoscaler)."""
