"""The Airflow plugin, registered through the `airflow.plugins` entry point (pyproject.toml). Kept light:
every Airflow process imports it."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from .links import SnapshotLink, SparkUILink


class SavepointsPlugin(AirflowPlugin):
    name = "savepoints"
    operator_extra_links = [SnapshotLink(), SparkUILink()]
