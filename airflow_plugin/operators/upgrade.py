"""The upgrade's tasks: a step of an upgrade (core/upgrades: the record in the store, advanced by steps the CLI
shares), the wait for a step that waits for the world (the new version catching up, healthy), and, for use
on their own, the pre-flight of a new version against a snapshot and the rollback to the old version."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue

from .. import stats
from ..compat import AirflowFailException
from ..core.context import JobContext
from ..core.jobs.preflight import preflight
from ..core.jobs.upgrade import rollback
from ..core.upgrades.record import Phase, Upgrade, Upgrades
from ..core.upgrades.run import begin, run_upgrade
from ..core.upgrades.steps import UpgradeSettings, advance
from ..links import SnapshotLink, SparkUILink
from .base import SavepointsBaseOperator, SavepointsMixin, flag, optional_int, task_errors
from .deployments import deployment_xcom

# a step that ended here needs the recovery task: the upgrade goes on with its abort or rollback
RECOVERING = frozenset(
    {Phase.ABORTING, Phase.ROLLING_BACK, Phase.BLOCKED, Phase.FAILED, Phase.ABORTED, Phase.ROLLED_BACK}
)


def _settled(upgrade: Upgrade, context: Context) -> dict[str, Any]:
    """The task's XCom (the record), and a failed task when the upgrade turned to its recovery."""
    record = upgrade.to_dict()
    if upgrade.phase in RECOVERING:
        context["ti"].xcom_push(key="upgrade", value=record)
        raise AirflowFailException(f"upgrade {upgrade.id} is {upgrade.phase}: {upgrade.error or '-'}")
    return record


class BeginUpgradeOperator(SavepointsBaseOperator):
    """Begin an upgrade of the job's running deployment to `version` and run its first steps: the live
    savepoint and the pre-flight, which decides the mode (`mode`: blue_green, stop_restore, or auto for the
    pre-flight's choice). Fails, touching nothing that runs, when the pre-flight blocks; the record is the
    XCom (`upgrade` too when the task fails). A retry of the task finds the upgrade it began."""

    template_fields: Sequence[str] = (
        "job",
        "version",
        "mode",
        "min_batches",
        "lag_must_fall",
        "allow_renames",
        "accept_source_gap",
        "catch_up_seconds",
    )

    def __init__(
        self,
        *,
        version: str,
        mode: str = "auto",
        min_batches: int | str = UpgradeSettings.min_batches,
        lag_must_fall: bool | str = True,
        allow_renames: bool | str = False,
        accept_source_gap: bool | str = False,
        catch_up_seconds: float | str = UpgradeSettings.catch_up_seconds,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.version, self.mode = version, mode
        self.min_batches, self.lag_must_fall = min_batches, lag_must_fall
        self.allow_renames, self.accept_source_gap = allow_renames, accept_source_gap
        self.catch_up_seconds = catch_up_seconds

    def run(self, ctx: JobContext, context: Context) -> dict[str, Any]:
        settings = UpgradeSettings(
            min_batches=optional_int(self.min_batches, "min_batches") or UpgradeSettings.min_batches,
            lag_must_fall=flag(self.lag_must_fall),
            allow_renames=flag(self.allow_renames),
            accept_source_gap=flag(self.accept_source_gap),
            catch_up_seconds=float(self.catch_up_seconds),
        )
        upgrade = begin(ctx, self.version, mode=str(self.mode or "") or None, settings=settings)  # auto: None
        upgrade = run_upgrade(ctx, upgrade, until=frozenset({Phase.LAUNCHING}))
        self.log.info("upgrade %s of %s: %s (%s)", upgrade.id, ctx.name, upgrade.phase, upgrade.modes)
        return _settled(upgrade, context)


class UpgradeStepOperator(SavepointsBaseOperator):
    """Run the upgrade's steps while it is in one of `phases` (the launch, the cutover); fails when the upgrade
    turned to its abort or rollback (the recovery task then finishes that). Nothing to do when the upgrade
    is elsewhere already (a mode without this phase)."""

    template_fields: Sequence[str] = ("job", "upgrade_id")

    def __init__(self, *, upgrade_id: str, phases: Sequence[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.upgrade_id = upgrade_id
        self.phases = frozenset(Phase(p) for p in phases)

    def run(self, ctx: JobContext, context: Context) -> dict[str, Any]:
        upgrade = Upgrades(ctx.store.storage).get(ctx.name, self.upgrade_id)
        started, cutting_over = time.monotonic(), upgrade.phase is Phase.CUTTING_OVER and upgrade.phase in self.phases
        while upgrade.phase in self.phases:
            upgrade = advance(ctx, upgrade)
        if cutting_over and upgrade.phase not in RECOVERING:  # the new version took over
            stats.timing(stats.CUTOVER, started, job=ctx.name)
        return _settled(upgrade, context)


class RecoverUpgradeOperator(SavepointsBaseOperator):
    """After a failed step: the upgrade's abort (before its cutover) or rollback (after it), run to its end.
    Returns the record; a cancelled or still unfinished upgrade is cancelled first."""

    template_fields: Sequence[str] = ("job", "upgrade_id")

    def __init__(self, *, upgrade_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.upgrade_id = upgrade_id

    def run(self, ctx: JobContext, context: Context) -> dict[str, Any]:
        if not self.upgrade_id:
            return {"phase": "none", "reason": "no upgrade was begun"}
        from ..core.upgrades.run import cancel

        upgrade = Upgrades(ctx.store.storage).get(ctx.name, self.upgrade_id)
        if not upgrade.phase.terminal and upgrade.phase not in (Phase.ABORTING, Phase.ROLLING_BACK):
            upgrade = cancel(ctx, upgrade)  # a task failed without the upgrade turning (its worker died)
        upgrade = run_upgrade(ctx, upgrade)
        self.log.warning("upgrade %s of %s ended %s: %s", upgrade.id, ctx.name, upgrade.phase, upgrade.error)
        return upgrade.to_dict()


class UpgradeWaitSensor(SavepointsMixin, BaseSensorOperator):
    """Wait while the upgrade is in one of `phases` (the new version catching up, the old one writing its last
    windows, the health gate after the cutover): each poke advances it once. Fails when the upgrade turned to
    its abort or rollback."""

    template_fields: Sequence[str] = ("job", "upgrade_id")

    def __init__(
        self,
        *,
        job: str,
        upgrade_id: str,
        phases: Sequence[str],
        aws_conn_id: str | None = "aws_default",
        spark_conn_id: str | None = "spark_default",
        jobs_file: str | None = None,
        keep_lease: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._savepoints_args(job, aws_conn_id, spark_conn_id, jobs_file)
        self.upgrade_id = upgrade_id
        self.phases = frozenset(Phase(p) for p in phases)

    def poke(self, context: Context) -> PokeReturnValue:
        with task_errors(context):
            ctx = self.job_context(context)
            upgrade = Upgrades(ctx.store.storage).get(ctx.name, self.upgrade_id)
            if upgrade.phase in self.phases:
                upgrade = advance(ctx, upgrade)
            if upgrade.phase in self.phases:
                note = upgrade.history[-1]["note"] if upgrade.history else ""
                self.log.info("upgrade %s: %s (%s)", upgrade.id, upgrade.phase, note)
                return PokeReturnValue(is_done=False)
            return PokeReturnValue(is_done=True, xcom_value=_settled(upgrade, context))


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
        timeout_seconds: float | None = None,  # None: the job's preflight_timeout (jobs file)
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
