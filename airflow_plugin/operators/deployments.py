"""Deploy and stop a job's deployments."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import Context

from ..assets import SNAPSHOTS, emit_snapshot_event, snapshot_xcom
from ..core.jobs.deploy import DeployRequest, activate, deploy, prestart
from ..core.jobs.deployments import Deployment, Deployments
from ..core.jobs.spec import JobSpec
from ..core.jobs.stop import stop
from ..core.snapshots.store import SnapshotStore
from ..links import SnapshotLink, SparkUILink
from .base import SavepointsBaseOperator


def deployment_xcom(store: SnapshotStore, deployment: Deployment) -> dict[str, Any]:
    status = Deployments(store.storage).status(deployment.job, deployment.id)
    return {
        "job": deployment.job,
        "deployment": deployment.id,
        "version": deployment.version,
        "checkpoint": deployment.checkpoint,
        "restored_from": deployment.restored_from,
        "restored_batch_id": deployment.restored_batch_id,
        "state": str(status.state) if status else None,
        "spark_ui": status.ui_url if status else None,
        "app_id": status.app_id if status else None,
    }


class DeployJobOperator(SavepointsBaseOperator):
    """Deploy a version of a job as a new deployment, from no state, the latest state, the latest
    savepoint, or a snapshot id; returns once the job reports RUNNING (or fails with its own error).

    :param version: a version declared in the jobs file (default: the job's default_version)
    :param restore: none | latest-state | latest-savepoint | <snapshot id>
    :param partitions: state partitions, when different from the snapshot's (a rescale)
    :param standby_deployment: a driver pre-started by PrestartJobOperator: restore into it and start it
        (its version is the one it was launched with)
    """

    template_fields: Sequence[str] = ("job", "version", "restore", "partitions", "standby_deployment")
    operator_extra_links = (SparkUILink(),)

    def __init__(
        self,
        *,
        version: str | None = None,
        restore: str = "none",
        partitions: int | str | None = None,
        wait_seconds: float = 180.0,
        standby_deployment: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.version = version
        self.restore = restore
        self.partitions = partitions
        self.wait_seconds = wait_seconds
        self.standby_deployment = standby_deployment

    def run(self, job: JobSpec, store: SnapshotStore, context: Context) -> dict[str, Any]:
        if self.standby_deployment:
            deployment = activate(
                job,
                store,
                self.standby_deployment,
                self.restore or "none",
                wait_seconds=self.wait_seconds,
                progress=self.progress,
            )
        else:
            request = DeployRequest(
                job,
                self.version or None,
                restore=self.restore or "none",
                partitions=int(self.partitions) if self.partitions not in (None, "", "None") else None,
                wait_seconds=self.wait_seconds,
                requested_by=self.requested_by(context),
            )
            deployment = deploy(request, store, command_builder=self.hook.command_builder, progress=self.progress)
        restored = deployment.restored_from or "nothing"
        self.log.info("deployed %s %s as %s (restored from %s)", job.name, deployment.version, deployment.id, restored)
        return deployment_xcom(store, deployment)


class PrestartJobOperator(SavepointsBaseOperator):
    """Launch a version's driver next to the running deployment, in STANDBY: it creates its Spark session
    and waits. DeployJobOperator(standby_deployment=...) later restores the state into it and starts it,
    so a cutover's downtime does not include the JVM and session start-up."""

    template_fields: Sequence[str] = ("job", "version")

    def __init__(self, *, version: str | None = None, wait_seconds: float = 180.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.version = version
        self.wait_seconds = wait_seconds

    def run(self, job: JobSpec, store: SnapshotStore, context: Context) -> dict[str, Any]:
        deployment = prestart(
            job, store, self.version or None, wait_seconds=self.wait_seconds, command_builder=self.hook.command_builder
        )
        self.log.info("pre-started %s %s as %s (STANDBY)", job.name, deployment.version, deployment.id)
        return deployment_xcom(store, deployment)


class StopJobOperator(SavepointsBaseOperator):
    """Stop the job's running deployment at a batch boundary, optionally draining what is available first
    and taking a savepoint of the quiescent checkpoint (stop-with-savepoint)."""

    template_fields: Sequence[str] = ("job", "labels")
    operator_extra_links = (SnapshotLink(),)

    def __init__(
        self,
        *,
        savepoint: bool = False,
        drain: bool = False,
        pin: bool = False,
        labels: dict[str, str] | None = None,
        timeout_seconds: float | None = None,
        **kwargs: Any,
    ) -> None:
        if savepoint:
            kwargs.setdefault("outlets", [SNAPSHOTS])
        super().__init__(**kwargs)
        self.savepoint = savepoint
        self.drain = drain
        self.pin = pin
        self.labels = labels or {}
        self.timeout_seconds = timeout_seconds

    def run(self, job: JobSpec, store: SnapshotStore, context: Context) -> dict[str, Any]:
        result = stop(
            job,
            store,
            savepoint=self.savepoint,
            drain=self.drain,
            timeout=self.timeout_seconds,
            requested_by=self.requested_by(context),
            labels=dict(self.labels),
            pin=self.pin,
            progress=self.progress,
        )
        value = result.to_dict()
        if result.snapshot is not None:
            value["snapshot"] = snapshot_xcom(store, result.snapshot)
            emit_snapshot_event(context, store, result.snapshot)
        return value
