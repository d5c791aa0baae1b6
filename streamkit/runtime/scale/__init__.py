"""Scaling a running job's processors: a joining processor's bootstrap beside the one it
splits from, its handover in place, a shrink's staging store, and the seeds that start
them from changelogs. It works through a member's task manager (``runtime.tasks``)."""
