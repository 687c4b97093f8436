"""The savepoints triggers: `from airflow_plugin.triggers import DeploymentHealthTrigger, UpgradeTrigger`; the jobs
file's watcher (an asset's, for the reconcile DAG): `JobsFileChangedTrigger`."""

from .base import SavepointsPollTrigger
from .health import DeploymentHealthTrigger
from .jobs_file import JobsFileChangedTrigger
from .upgrade import UpgradeTrigger

__all__ = ["DeploymentHealthTrigger", "JobsFileChangedTrigger", "SavepointsPollTrigger", "UpgradeTrigger"]
