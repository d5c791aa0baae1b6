"""The runtime: workers, group members, processors, checkpoints, dead letters."""
