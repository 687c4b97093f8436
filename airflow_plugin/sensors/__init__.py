"""The savepoints sensors: `from airflow_plugin.sensors import DeploymentHealthSensor, UpgradeWaitSensor`."""

from .health import DeploymentHealthSensor
from .upgrade import UpgradeWaitSensor

__all__ = ["DeploymentHealthSensor", "UpgradeWaitSensor"]
