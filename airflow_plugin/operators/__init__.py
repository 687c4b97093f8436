"""The savepoints operators, importable from here as from any provider:

from airflow_plugin.operators import DeployJobOperator, SavepointOperator, UpgradeJobOperator

Sensors (waits) are in `airflow_plugin.sensors`, triggers in `airflow_plugin.triggers`.
"""

from .base import SavepointsBaseOperator
from .deployments import DeployJobOperator, PrestartJobOperator, StopJobOperator
from .leases import ReleaseLeaseOperator
from .reconcile import ApplyJobOperator
from .retention import RetentionOperator
from .snapshots import SavepointOperator, VerifySnapshotOperator
from .upgrade import (
    BeginUpgradeOperator,
    PreflightCheckOperator,
    RecoverUpgradeOperator,
    RollbackOperator,
    UpgradeBaseOperator,
    UpgradeJobOperator,
    UpgradeStepOperator,
)

__all__ = [
    "ApplyJobOperator",
    "BeginUpgradeOperator",
    "DeployJobOperator",
    "PreflightCheckOperator",
    "PrestartJobOperator",
    "RecoverUpgradeOperator",
    "ReleaseLeaseOperator",
    "RetentionOperator",
    "RollbackOperator",
    "SavepointOperator",
    "SavepointsBaseOperator",
    "StopJobOperator",
    "UpgradeBaseOperator",
    "UpgradeJobOperator",
    "UpgradeStepOperator",
    "VerifySnapshotOperator",
]
