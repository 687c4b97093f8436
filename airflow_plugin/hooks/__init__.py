"""Hooks: how the Airflow layer talks to Spark and to the snapshot store."""
