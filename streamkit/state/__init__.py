"""State beyond the local store: the job's changelog and restores from it."""
