"""Deploy and stop a job's deployments."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import Context

from .. import stats
from ..assets import SNAPSHOTS, emit_snapshot_event, snapshot_xcom
from ..core.errors import NoState
from ..core.jobs.context import JobContext
from ..core.jobs.deploy import DEFAULT_RESTORE, FIRST_DEPLOYMENT, DeployRequest, deploy
from ..core.jobs.deployments import describe
from ..core.jobs.observe import observe_deployment
from ..core.jobs.stop import stop
from ..core.records.deployment import Deployment
from ..core.records.manifest import parse_labels
from ..core.upgrades.launch import activate, prestart
from ..dag_params import RESTORE_TITLE
from ..links import SnapshotLink, SparkUILink
from .base import SavepointsBaseOperator, flag, optional_int


def deployment_xcom(ctx: JobContext, deployment: Deployment) -> dict[str, Any]:
    """A deployment as tasks return it: the engine's one shape (describe), as observed now."""
    return describe(deployment, *observe_deployment(ctx, deployment))


class DeployJobOperator(SavepointsBaseOperator):
    """Deploy a version of a job as a new deployment, from the latest state (the default), the latest savepoint,
    a snapshot id, or no state; returns once the job reports RUNNING (or fails with its own error).

    :param version: a version declared in the jobs file (default: the job's default_version)
    :param restore: latest-state (the default, as `savepoints deploy`'s and the deploy DAG's: a job with history
        continues from its latest state, one that never started a query starts fresh) | latest-savepoint |
        <snapshot id> | none (start empty; of a job with state, the task log says which state, at which batch, is
        not carried over)
    :param partitions: state partitions, when different from the snapshot's (a rescale)
    :param standby_deployment: a driver pre-started by PrestartJobOperator: restore into it and start it
        (its version is the one it was launched with)
    :param rewind_sink: a sink that committed batches after the snapshot is rewound to it (a file sink's later
        output moved into its quarantine, a Delta table RESTOREd to the snapshot's version; those batches are
        written again) instead of failing the task
    :param accept_source_gap: restore even if Kafka no longer holds every record after the snapshot (the gap
        is recorded in the deployment and the snapshot's history) instead of failing the task
    """

    template_fields: Sequence[str] = (
        "job",
        "version",
        "restore",
        "partitions",
        "standby_deployment",
        "rewind_sink",
        "accept_source_gap",
    )
    operator_extra_links = (SparkUILink(),)

    def __init__(
        self,
        *,
        version: str | None = None,
        restore: str = DEFAULT_RESTORE,
        partitions: int | str | None = None,
        wait_seconds: float = 180.0,
        standby_deployment: str | None = None,
        rewind_sink: bool | str = False,
        accept_source_gap: bool | str = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.rewind_sink = rewind_sink
        self.accept_source_gap = accept_source_gap
        self.version = version
        self.restore = restore
        self.partitions = partitions
        self.wait_seconds = wait_seconds
        self.standby_deployment = standby_deployment

    def run(self, ctx: JobContext, context: Context) -> dict[str, Any]:
        started = time.monotonic()
        try:
            deployment = self._deploy(ctx)
        except NoState as exc:  # the engine names the CLI's flag: a DAG user has a form field instead
            raise exc.with_fix(
                f'set "{RESTORE_TITLE}" to none in the DAG\'s trigger form (restore="none" for a DeployJobOperator) '
                "for a fresh start; the earlier state is then not used"
            ) from None
        if deployment.restored_from:
            stats.timing(stats.RESTORE, started, job=ctx.name)
        if deployment.fresh_start:  # a job that never started a query; or one with state, and what is not carried over
            level = logging.INFO if deployment.fresh_start == FIRST_DEPLOYMENT else logging.WARNING
            self.log.log(level, "%s starts fresh: %s", deployment.id, deployment.fresh_start)
        restored = deployment.restored_from or "nothing"
        self.log.info("deployed %s %s as %s (restored from %s)", ctx.name, deployment.version, deployment.id, restored)
        return deployment_xcom(ctx, deployment)

    def _deploy(self, ctx: JobContext) -> Deployment:
        restore, rewind, gap = self.restore or DEFAULT_RESTORE, flag(self.rewind_sink), flag(self.accept_source_gap)
        if self.standby_deployment:
            deployment = activate(
                ctx,
                self.standby_deployment,
                restore,
                wait_seconds=self.wait_seconds,
                rewind_sink=rewind,
                accept_source_gap=gap,
            )
        else:
            partitions = optional_int(self.partitions, "partitions")
            request = DeployRequest(self.version or None, restore, partitions, self.wait_seconds, rewind, gap)
            deployment = deploy(ctx, request)
        return deployment


class PrestartJobOperator(SavepointsBaseOperator):
    """Launch a version's driver next to the running deployment, in STANDBY: it creates its Spark session
    and waits. DeployJobOperator(standby_deployment=...) later restores the state into it and starts it,
    so a cutover's downtime does not include the JVM and session start-up.

    :param prerestore: a snapshot (id) restored into its location right away, e.g. the upgrade's live
        savepoint: the activation then moves only the files that changed since
    """

    template_fields: Sequence[str] = ("job", "version", "prerestore")

    def __init__(
        self,
        *,
        version: str | None = None,
        wait_seconds: float = 180.0,
        prerestore: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.version = version
        self.wait_seconds = wait_seconds
        self.prerestore = prerestore

    def run(self, ctx: JobContext, context: Context) -> dict[str, Any]:
        prerestore = self.prerestore or None
        deployment = prestart(ctx, self.version or None, wait_seconds=self.wait_seconds, prerestore=prerestore)
        self.log.info("pre-started %s %s as %s (STANDBY)", ctx.name, deployment.version, deployment.id)
        return deployment_xcom(ctx, deployment)


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
        labels: dict[str, str] | str | None = None,
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

    def run(self, ctx: JobContext, context: Context) -> dict[str, Any]:
        result = stop(
            ctx,
            savepoint=self.savepoint,
            drain=self.drain,
            timeout=self.timeout_seconds,
            labels=parse_labels(self.labels),
            pin=flag(self.pin),
        )
        value = result.to_dict()
        if result.snapshot is not None:
            value["snapshot"] = snapshot_xcom(ctx.store, result.snapshot)
            emit_snapshot_event(context, ctx.store, result.snapshot)
        return value
