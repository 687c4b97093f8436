"""The upgrade's tasks. `UpgradeJobOperator`: the whole upgrade in one task, as `savepoints upgrade` runs it, deferring
while it waits. Or one task per phase, for a grid that shows them (`airflow_plugin.task_groups.upgrade_task_group`
wires them): `BeginUpgradeOperator`, `UpgradeStepOperator`, the wait of a step that waits for the world
(sensors/upgrade.py), `RecoverUpgradeOperator`. And, for use on their own, the pre-flight of a new version against a
snapshot and the rollback to the old version. Every one advances the same record in the store (core/upgrades)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import Context

from .. import stats
from ..compat import AirflowFailException
from ..core.jobs.context import JobContext
from ..core.upgrades.preflight import preflight
from ..core.upgrades.record import Phase, Upgrade, Upgrades
from ..core.upgrades.rollback import rollback
from ..core.upgrades.run import approve, await_approval, begin, cancel, outcome, run_upgrade
from ..core.upgrades.steps import UpgradeSettings, advance, waiting
from ..links import SnapshotLink, SparkUILink
from ..triggers.upgrade import UpgradeTrigger
from .base import SavepointsBaseOperator, SavepointsMixin, flag, optional_int, task_errors
from .deployments import deployment_xcom

# the phases before the launch: the live savepoint, the pre-flight, a migration's run
BEFORE_LAUNCH = frozenset({Phase.SAVEPOINTING, Phase.PREFLIGHT, Phase.MIGRATING})
# a step that ended here needs the recovery task: the upgrade goes on with its abort or rollback
RECOVERING = frozenset(
    {Phase.ABORTING, Phase.ROLLING_BACK, Phase.BLOCKED, Phase.FAILED, Phase.ABORTED, Phase.ROLLED_BACK}
)


def settled(upgrade: Upgrade, context: Context) -> dict[str, Any]:
    """The task's XCom (the record), and a failed task when the upgrade turned to its recovery."""
    record = upgrade.to_dict()
    if upgrade.phase in RECOVERING:
        context["ti"].xcom_push(key="upgrade", value=record)
        raise AirflowFailException(f"upgrade {upgrade.id} is {upgrade.phase}: {upgrade.error or '-'}")
    return record


WAKE_SECONDS = 600.0  # a deferred upgrade is advanced at least this often: its lease (30 minutes) is renewed


class UpgradeDriver(SavepointsMixin):
    """Advances an upgrade step by step; while a step waits for the world it defers to UpgradeTrigger (no worker slot
    held) or, not deferrable, polls in the worker. What UpgradeJobOperator and UpgradeWaitSensor share."""

    deferrable: bool
    poll_interval: float

    def drive(
        self, ctx: JobContext, context: Context, upgrade: Upgrade, phases: frozenset[Phase] | None = None
    ) -> Upgrade:
        """Advance until the upgrade ends or leaves `phases` (None: until it ends)."""
        while not upgrade.phase.terminal and (phases is None or upgrade.phase in phases):
            before = upgrade.phase
            upgrade = advance(ctx, upgrade)
            if upgrade.phase is not before:
                note = upgrade.history[-1]["note"] if upgrade.history else ""
                self.log.info("upgrade %s: %s (%s)", upgrade.id, upgrade.phase, note)  # type: ignore[attr-defined]
                continue
            why = waiting(ctx, upgrade)
            if why is None:
                continue
            self.log.info("upgrade %s waits: %s", upgrade.id, why)  # type: ignore[attr-defined]
            if self.deferrable:
                self._defer(upgrade)
            time.sleep(self.poll_interval)
        return upgrade

    def _defer(self, upgrade: Upgrade) -> None:
        trigger = UpgradeTrigger(
            job=self.job,
            upgrade_id=upgrade.id,
            phase=str(upgrade.phase),
            deadline=time.time() + WAKE_SECONDS,  # a step's own deadline passing ends the wait earlier (`waiting`)
            poll_interval=self.poll_interval,
            aws_conn_id=self.aws_conn_id,
            jobs_file=self.jobs_file,
        )
        self.defer(trigger=trigger, method_name="execute_complete")  # type: ignore[attr-defined]

    def resumed(self, context: Context, event: dict[str, Any] | None) -> tuple[JobContext, Upgrade]:
        """After the trigger: the job's context and the upgrade as it is now (any event: the task looks again)."""
        event = event or {}
        if event.get("status") == "error":  # the store could not be read: retryable
            raise RuntimeError(f"waiting for upgrade {event.get('upgrade', '')} failed: {event.get('message')}")
        ctx = self.job_context(context)
        return ctx, Upgrades(ctx.store.storage).get(ctx.name, str(event["upgrade"]))


class UpgradeBaseOperator(SavepointsBaseOperator):
    """What begins an upgrade: its version, mode and settings (the DAG form's fields, `savepoints upgrade`'s flags),
    the base of UpgradeJobOperator and BeginUpgradeOperator. A retry of the task finds the upgrade it began."""

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
        confirm_seconds: float = UpgradeSettings.confirm_seconds,
        start_seconds: float = UpgradeSettings.start_seconds,
        answer_seconds: float = UpgradeSettings.answer_seconds,
        replay_margin_seconds: float = UpgradeSettings.replay_margin_seconds,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.version, self.mode = version, mode
        self.min_batches, self.lag_must_fall = min_batches, lag_must_fall
        self.allow_renames, self.accept_source_gap = allow_renames, accept_source_gap
        self.catch_up_seconds, self.confirm_seconds = catch_up_seconds, confirm_seconds
        self.answer_seconds, self.replay_margin_seconds = answer_seconds, replay_margin_seconds
        self.start_seconds = start_seconds

    def begin(self, ctx: JobContext) -> Upgrade:
        settings = UpgradeSettings(
            min_batches=optional_int(self.min_batches, "min_batches") or UpgradeSettings.min_batches,
            lag_must_fall=flag(self.lag_must_fall),
            allow_renames=flag(self.allow_renames),
            accept_source_gap=flag(self.accept_source_gap),
            catch_up_seconds=float(self.catch_up_seconds),
            confirm_seconds=float(self.confirm_seconds),
            start_seconds=float(self.start_seconds),
            answer_seconds=float(self.answer_seconds),
            replay_margin_seconds=float(self.replay_margin_seconds),
        )
        return begin(ctx, self.version, mode=str(self.mode or "") or None, settings=settings)  # auto: None


class UpgradeJobOperator(UpgradeDriver, UpgradeBaseOperator):
    """Upgrade the job's running deployment to `version`, the whole upgrade in one task, as `savepoints upgrade` runs
    it: a live savepoint, the pre-flight (which also decides the mode: `mode` auto, or blue_green, stop_restore,
    replay, migrate), the new version, its catch-up and cutover, the old version's retirement and the health gate;
    an abort or rollback on failure. While a step waits for the world it defers to UpgradeTrigger and holds no
    worker slot (`deferrable`, the default), else polls every `poll_interval` seconds. A retried or resumed task
    continues the same upgrade (its record carries the task's request id). The record is the XCom; the task fails
    (no retry: the upgrade ended) when the upgrade did not go through: BLOCKED, ABORTED, ROLLED_BACK, FAILED.

    `approve`: after the pre-flight, before anything is launched, a person approves or rejects the launch in
    Airflow's Required Actions (human-in-the-loop, as ApprovalOperator asks), the plan in front of them; the job's
    lease is kept meanwhile (for `approval_timeout` and the upgrade's lease time more). Rejected, or not answered within
    `approval_timeout`, the upgrade is aborted: the old version runs on, untouched. Should the task be killed while it
    waits, the next `savepoints apply` aborts the upgrade once that lease expired. The approval is recorded
    (`approved_by`): a retried task does not ask again."""

    template_fields: Sequence[str] = (*UpgradeBaseOperator.template_fields, "approve")
    ui_color = "#fbefe8"

    def __init__(
        self,
        *,
        deferrable: bool = True,
        poll_interval: float = 10.0,
        approve: bool | str = False,
        approval_timeout: timedelta = timedelta(hours=1),
        **kwargs: Any,
    ) -> None:
        """`deferrable`: waits in the triggerer, holding no worker slot."""
        super().__init__(**kwargs)
        self.deferrable, self.poll_interval = deferrable, poll_interval
        self.approve, self.approval_timeout = approve, approval_timeout

    def run(self, ctx: JobContext, context: Context) -> dict[str, Any]:
        return self._go_on(ctx, context, self.begin(ctx))

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        with task_errors(context, self.job):
            if event is not None and ("chosen_options" in event or "error_type" in event):  # a person answered
                return self._answered(context, event)
            ctx, upgrade = self.resumed(context, event)
            return self._go_on(ctx, context, upgrade)

    def _go_on(self, ctx: JobContext, context: Context, upgrade: Upgrade) -> dict[str, Any]:
        """Drive the upgrade to its end, stopping once before its launch to ask a person when `approve`."""
        if flag(self.approve) and not upgrade.approved_by:
            upgrade = self.drive(ctx, context, upgrade, phases=BEFORE_LAUNCH)
            if upgrade.phase is Phase.LAUNCHING:
                self._ask(context, await_approval(ctx, upgrade, self.approval_timeout.total_seconds()))
        return self._ended(self.drive(ctx, context, upgrade), context)

    def _approval(self, upgrade: Upgrade | None = None) -> Any:
        """Airflow's own approval request (its form, its wait in every Airflow version, its answer's checks)."""
        from airflow.providers.standard.operators.hitl import ApprovalOperator

        plan = ""
        if upgrade is not None:
            why = upgrade.modes.get(upgrade.mode or "", "")
            running = f" (deployment {upgrade.old_deployment})" if upgrade.old_deployment else ""
            plan = (
                f"Upgrade {upgrade.id}: job **{upgrade.job}** from {upgrade.old_version}{running} "
                f"to **{upgrade.to_version}**, mode **{upgrade.mode}**"
                f"{f' ({why})' if why else ''}. The pre-flight passed on savepoint {upgrade.savepoint}. Nothing is "
                "launched yet and the old version runs on; Reject aborts the upgrade."
            )
        return ApprovalOperator(
            task_id=f"{self.task_id}__approval",
            subject=f"Launch {self.version} of {self.job}?",
            body=plan,
            response_timeout=self.approval_timeout,
        )

    def _ask(self, context: Context, upgrade: Upgrade) -> None:
        self.log.info("upgrade %s waits for a person to approve its launch (Required Actions)", upgrade.id)
        self._approval(upgrade).execute(context)  # defers (or awaits input): execute_complete gets the answer

    def _answered(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        ctx = self.job_context(context)
        upgrade = self.begin(ctx)  # this task's upgrade (its request id)
        if upgrade.phase.terminal:  # an answer too late: the approval was abandoned and the upgrade aborted meanwhile
            return self._ended(upgrade, context)
        try:
            answer = self._approval().execute_complete(context, event)
        except Exception as exc:  # no answer in time, or none that counts: nothing launched, abort
            upgrade = cancel(ctx, upgrade, f"not approved: {exc or 'no answer within the approval timeout'}")
            return self._ended(self.drive(ctx, context, upgrade), context)
        who = answer["responded_by_user"] or {}
        by = str(who.get("name") or who.get("id") or "") if isinstance(who, dict) else str(who)
        if answer["chosen_options"] != ["Approve"]:
            upgrade = cancel(ctx, upgrade, f"launch rejected by {by or 'a person'}")
            return self._ended(self.drive(ctx, context, upgrade), context)
        self.log.info("upgrade %s: launch approved by %s", upgrade.id, by)
        return self._go_on(ctx, context, approve(ctx, upgrade, by))

    def _ended(self, upgrade: Upgrade, context: Context) -> dict[str, Any]:
        record = upgrade.to_dict()
        try:
            outcome(upgrade)
        except Exception as exc:  # BLOCKED, ABORTED, ROLLED_BACK, FAILED: the upgrade ended; a retry changes nothing
            context["ti"].xcom_push(key="upgrade", value=record)
            raise AirflowFailException(str(exc)) from exc
        self.log.info("upgrade %s of %s: DONE, %s runs", upgrade.id, upgrade.job, upgrade.to_version)
        return record


class BeginUpgradeOperator(UpgradeBaseOperator):
    """Begin an upgrade of the job's running deployment to `version` and run its first steps: the live
    savepoint and the pre-flight, which decides the mode (`mode`: blue_green, stop_restore, or auto for the
    pre-flight's choice). Fails, touching nothing that runs, when the pre-flight blocks; the record is the
    XCom (`upgrade` too when the task fails)."""

    def run(self, ctx: JobContext, context: Context) -> dict[str, Any]:
        upgrade = run_upgrade(ctx, self.begin(ctx), until=frozenset({Phase.LAUNCHING}))
        self.log.info("upgrade %s of %s: %s (%s)", upgrade.id, ctx.name, upgrade.phase, upgrade.modes)
        return settled(upgrade, context)


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
        return settled(upgrade, context)


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
        upgrade = Upgrades(ctx.store.storage).get(ctx.name, self.upgrade_id)
        if not upgrade.phase.terminal and upgrade.phase not in (Phase.ABORTING, Phase.ROLLING_BACK):
            upgrade = cancel(ctx, upgrade)  # a task failed without the upgrade turning (its worker died)
        upgrade = run_upgrade(ctx, upgrade)
        self.log.warning("upgrade %s of %s ended %s: %s", upgrade.id, ctx.name, upgrade.phase, upgrade.error)
        return upgrade.to_dict()


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
