"""The savepoints triggers: `from airflow_plugin.triggers import DeploymentHealthTrigger, UpgradeTrigger`."""

from .base import SavepointsPollTrigger
from .health import DeploymentHealthTrigger
from .upgrade import UpgradeTrigger

__all__ = ["DeploymentHealthTrigger", "SavepointsPollTrigger", "UpgradeTrigger"]
