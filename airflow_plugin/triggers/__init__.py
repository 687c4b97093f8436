"""The savepoints triggers: `from airflow_plugin.triggers import DeploymentHealthTrigger`."""

from .base import SavepointsPollTrigger
from .health import DeploymentHealthTrigger

__all__ = ["DeploymentHealthTrigger", "SavepointsPollTrigger"]
