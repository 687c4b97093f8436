"""Hooks: how the Airflow layer talks to Spark and to the snapshot store.
`from airflow_plugin.hooks import SavepointsHook`."""

from .savepoints import SavepointsHook

__all__ = ["SavepointsHook"]
