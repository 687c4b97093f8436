"""Helpers the tests share: synthetic checkpoints (no JVM), real Spark checkpoints of every kind, Airflow stacks."""
