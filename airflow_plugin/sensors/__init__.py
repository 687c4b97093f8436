"""The savepoints sensors: `from airflow_plugin.sensors import DeploymentHealthSensor`."""

from .health import DeploymentHealthSensor

__all__ = ["DeploymentHealthSensor"]
