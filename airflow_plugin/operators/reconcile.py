"""One declared job made to run as the jobs file says (`savepoints apply JOB`, core/reconcile/): the reconcile
DAG maps it over every job that declares `desired`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import Context

from ..core.jobs.context import JobContext
from ..core.reconcile.apply import apply_job
from .base import SavepointsBaseOperator, flag


class ApplyJobOperator(SavepointsBaseOperator):
    """Observe the job, plan its step (nothing, deploy, restart after a failure, upgrade to the declared version,
    stop with a savepoint, hold for a person) and, unless `dry_run`, carry it out under the job's lease. Returns
    the step and its outcome; a step that could not be carried out fails the task with its error (a lease a
    person holds: refused, no retry; the next scheduled run looks again)."""

    template_fields: Sequence[str] = ("job", "dry_run")

    def __init__(self, *, dry_run: bool | str = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dry_run = dry_run

    def run(self, ctx: JobContext, context: Context) -> dict[str, Any]:
        applied = apply_job(ctx, dry_run=flag(self.dry_run))
        self.log.info("%s", applied.step.describe())
        self.log.info("%s", applied.outcome)
        if applied.error is not None:
            raise applied.error
        return applied.to_dict()
