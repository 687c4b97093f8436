"""Example job with transformWithState: a running total of events per user (v1.py), and `regrouped`, a
wrong upgrade that keys the same state by country. Feed it with spark_jobs.generate, like `windowed`."""
