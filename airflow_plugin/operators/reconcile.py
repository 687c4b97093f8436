"""One declared job made to run as the jobs file says (`savepoints apply JOB`, core/reconcile/): the reconcile
DAG maps it over every job that declares `desired`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import Context

from ..core.jobs.context import JobContext
from ..core.reconcile.apply import Applied, apply_job, loop_context, next_step, upgrade_ended, upgrade_of
from ..core.reconcile.plan import Action
from .base import SavepointsBaseOperator, flag, task_errors
from .upgrade import UpgradeDriver


class ApplyJobOperator(UpgradeDriver, SavepointsBaseOperator):
    """Observe the job, plan its step (nothing, deploy, restart after a failure, upgrade to the declared version,
    stop with a savepoint, hold for a person) and, unless `dry_run`, carry it out under the job's lease. Returns
    the step and its outcome; a step that could not be carried out fails the task with its error (a lease a
    person holds: refused, no retry; the next scheduled run looks again). An upgrade waits for the world (its
    catch-up, the new version's health) in Airflow's triggerer, holding no worker slot (`deferrable`, the
    default), as UpgradeJobOperator's does; else it polls every `poll_interval` seconds in the worker."""

    template_fields: Sequence[str] = ("job", "dry_run")

    def __init__(
        self, *, dry_run: bool | str = False, deferrable: bool = True, poll_interval: float = 10.0, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.dry_run = dry_run
        self.deferrable, self.poll_interval = deferrable, poll_interval

    def run(self, ctx: JobContext, context: Context) -> dict[str, Any]:
        ctx = loop_context(ctx)
        step = next_step(ctx)
        if flag(self.dry_run) or step.action not in (Action.UPGRADE, Action.RESUME_UPGRADE):
            return self._report(apply_job(ctx, dry_run=flag(self.dry_run), step=step))
        upgrade = upgrade_of(ctx, step)
        if upgrade is None:
            return self._report(Applied(step, "the upgrade ended meanwhile"))
        self.log.info("%s", step.describe())
        return self._report(upgrade_ended(ctx, self.drive(ctx, context, upgrade), step))  # defers while it waits

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """The loop's upgrade, after a wait in the triggerer: driven on to its end."""
        with task_errors(context, self.job):
            ctx, upgrade = self.resumed(context, event)
            ctx = loop_context(ctx)
            return self._report(upgrade_ended(ctx, self.drive(ctx, context, upgrade)))

    def _report(self, applied: Applied) -> dict[str, Any]:
        self.log.info("%s", applied.step.describe())
        self.log.info("%s", applied.outcome)
        if applied.error is not None:
            raise applied.error
        return applied.to_dict()
