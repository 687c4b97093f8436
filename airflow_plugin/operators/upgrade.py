"""The two upgrade-specific steps: the pre-flight of a new version against a snapshot, and the rollback
to the old version from the savepoint the upgrade cut over from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import Context

from ..core.context import JobContext
from ..core.jobs.preflight import DEFAULT_TIMEOUT, preflight
from ..core.jobs.upgrade import rollback
from ..links import SnapshotLink, SparkUILink
from .base import SavepointsBaseOperator, flag
from .deployments import deployment_xcom


class PreflightCheckOperator(SavepointsBaseOperator):
    """Will `version` run on this snapshot's state? Runs the new version as a separate Spark application
    against throwaway copies (batch N re-planned, noop sink) and compares state schema field names.
    Fails the task, touching nothing that runs, if the upgrade is blocked; its report (the reason) is then
    the task's XCom `report`."""

    template_fields: Sequence[str] = ("job", "version", "snapshot_id", "allow_renames", "accept_source_gap")
    operator_extra_links = (SnapshotLink(),)

    def __init__(
        self,
        *,
        version: str,
        snapshot_id: str = "latest",
        allow_renames: bool | str = False,
        accept_source_gap: bool | str = False,
        timeout_seconds: float = DEFAULT_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.version = version
        self.snapshot_id = snapshot_id
        self.allow_renames = allow_renames
        self.accept_source_gap = accept_source_gap
        self.timeout_seconds = timeout_seconds

    def run(self, ctx: JobContext, context: Context) -> dict[str, Any]:
        report = preflight(
            ctx,
            self.snapshot_id,
            self.version,
            allow_renames=flag(self.allow_renames),
            timeout=self.timeout_seconds,
            accept_source_gap=flag(self.accept_source_gap),
        )
        self.log.info("pre-flight of %s %s: %s", ctx.name, self.version, report.reason)
        if report.blocked() is not None:  # the report stays readable (XCom "report") when the task fails
            context["ti"].xcom_push(key="report", value={**report.to_dict(), "id": report.snapshot})
        report.raise_if_blocked()
        return {**report.to_dict(), "id": report.snapshot}


class RollbackOperator(SavepointsBaseOperator):
    """Put the version a savepoint was taken from back into service from that savepoint, after stopping
    (or killing) whatever replaced it; does nothing if the savepoint's own deployment still runs. Without a
    savepoint (the old version was never stopped) it only stops a pre-started driver left in STANDBY."""

    template_fields: Sequence[str] = ("job", "snapshot_id")
    operator_extra_links = (SparkUILink(),)

    def __init__(self, *, snapshot_id: str, stop_timeout_seconds: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.snapshot_id = snapshot_id
        self.stop_timeout_seconds = stop_timeout_seconds

    def run(self, ctx: JobContext, context: Context) -> dict[str, Any]:
        result = rollback(ctx, self.snapshot_id or None, stop_timeout=self.stop_timeout_seconds)
        self.log.warning("rollback of %s: %s (replaced: %s)", ctx.name, result.reason, result.replaced or "nothing")
        running = deployment_xcom(ctx, result.deployment) if result.deployment else {}
        return {**running, **result.to_dict()}
